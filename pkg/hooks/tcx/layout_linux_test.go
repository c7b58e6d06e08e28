package tcx

import (
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/carbd/carbd/pkg/hooks/nfrules"
)

// TestLayoutMatchesBTF checks the Go mirrors of tc.h against the BTF of
// the compiled object: same size, and each Go field at the offset and of
// the size of the C member in the same position.
func TestLayoutMatchesBTF(t *testing.T) {
	spec, err := loadSpec(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mapName string
		key     bool
		goType  any
	}{
		{"flows", true, RawFlowKey{}},
		{"flows", false, rawFlowStats{}},
		{"verdicts", true, RawFlowKey{}},
		{"verdicts", false, rawVerdict{}},
		{"config", false, rawConfig{}},
		{"counters", false, rawCounter{}},
	} {
		ms := spec.Maps[tc.mapName]
		typ := ms.Value
		if tc.key {
			typ = ms.Key
		}
		st, ok := btf.UnderlyingType(typ).(*btf.Struct)
		if !ok {
			t.Fatalf("%s: BTF type %v is not a struct", tc.mapName, typ)
		}
		gt := reflect.TypeOf(tc.goType)
		if uintptr(st.Size) != gt.Size() {
			t.Errorf("%s %s: C size %d, Go size %d", tc.mapName, st.Name, st.Size, gt.Size())
		}
		if len(st.Members) != gt.NumField() {
			t.Fatalf("%s %s: C has %d members, Go %d fields", tc.mapName, st.Name, len(st.Members), gt.NumField())
		}
		for i, m := range st.Members {
			f := gt.Field(i)
			size, err := btf.Sizeof(m.Type)
			if err != nil {
				t.Fatal(err)
			}
			if uintptr(m.Offset.Bytes()) != f.Offset || uintptr(size) != f.Type.Size() {
				t.Errorf("%s %s.%s: C offset %d size %d, Go %s offset %d size %d",
					tc.mapName, st.Name, m.Name, m.Offset.Bytes(), size, f.Name, f.Offset, f.Type.Size())
			}
			if !strings.EqualFold(strings.ReplaceAll(m.Name, "_", ""), strings.ReplaceAll(f.Name, "_", "")) &&
				!equivalentNames[m.Name+"="+f.Name] {
				t.Errorf("%s %s: member %d is %s in C, %s in Go", tc.mapName, st.Name, i, m.Name, f.Name)
			}
		}
	}
	if got := spec.Maps["counters"].MaxEntries; got != uint32(NumReasons) {
		t.Errorf("counters map has %d entries, Go knows %d reasons", got, NumReasons)
	}
}

var equivalentNames = map[string]bool{
	"sport=SrcPort": true, "dport=DstPort": true, "src=Src": true, "dst=Dst": true,
	"first_ns=FirstNs": true, "last_ns=LastNs": true,
}

func TestMarksMatchNfrules(t *testing.T) {
	want := nfrules.Marks{Mask: MarkMask, Pass: MarkPass, Queue: MarkQueue, LinkLocal: MarkLinkLocal}
	if nfrules.DefaultMarks != want {
		t.Errorf("nfrules.DefaultMarks %+v, tcx marks %+v", nfrules.DefaultMarks, want)
	}
}
