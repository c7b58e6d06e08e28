package capture

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// frame builds an Ethernet/IPv4/UDP frame carrying payload.
func frame(t *testing.T, payload string) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: []byte{10, 0, 0, 1}, DstIP: []byte{10, 0, 0, 2}}
	udp := &layers.UDP{SrcPort: 4000, DstPort: 5000}
	_ = udp.SetNetworkLayerForChecksum(ip)
	b := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(b, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, udp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// readComments reads a pcapng file with pcapgo and returns each frame's
// payload and comment as "payload|comment" (pcapgo does not expose
// comments: they are parsed from the block here).
func readFrames(t *testing.T, b []byte) []string {
	t.Helper()
	types, bodies := blocks(t, b)
	var out []string
	for i, typ := range types {
		if typ != blockEPB {
			continue
		}
		body := bodies[i]
		capLen := int(le32v(body[12:16]))
		data := body[20 : 20+capLen]
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		pl := ""
		if app := p.ApplicationLayer(); app != nil {
			pl = string(app.Payload())
		}
		opts := body[20+(capLen+3)/4*4:]
		comment := ""
		for len(opts) >= 4 {
			code, l := int(opts[0])|int(opts[1])<<8, int(opts[2])|int(opts[3])<<8
			if code == 0 {
				break
			}
			if code == optComment {
				comment = string(opts[4 : 4+l])
			}
			opts = opts[4+(l+3)/4*4:]
		}
		out = append(out, pl+"|"+comment)
	}
	return out
}

func le32v(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// A frame whose verdict is not final is held back until it is (the
// comment is then the final verdict), frames stay in capture order, the
// file is 0600 even when it existed with another mode, and secrets are
// written at once, ahead of held-back frames.
func TestStreamWritesFinalVerdicts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.pcapng")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	var final atomic.Bool
	s, err := NewStream(StreamConfig{Path: path, Ifname: "test0", Delay: time.Hour, Tick: 10 * time.Millisecond,
		Annotate: func(r Record) Annotation {
			if final.Load() {
				return Annotation{Verdict: "refuse", Seq: 7, Reason: "policy-refuse: test", Final: true}
			}
			return Annotation{Verdict: "held", Seq: 7}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("audit file mode %v, want 0600", fi.Mode().Perm())
	}
	now := time.Now()
	s.Add(Record{Time: now, Data: frame(t, "one"), Dir: Egress})
	s.Add(Record{Time: now, Data: frame(t, "two"), Dir: Egress})
	if _, err := s.Write([]byte("CLIENT_RANDOM 01 02\n")); err != nil {
		t.Fatal(err)
	}
	// The ticker has run several times: nothing but the header and the
	// secrets may be in the file, since no verdict is final.
	waitTicks(s, 5)
	b, _ := os.ReadFile(path)
	if got := readFrames(t, b); len(got) != 0 {
		t.Fatalf("frames written before their verdict was final: %q", got)
	}
	if types, _ := blocks(t, b); len(types) != 3 || types[2] != blockDSB {
		t.Fatalf("blocks %x, want section header, interface, secrets", types)
	}
	final.Store(true)
	b = waitFrames(t, path, 2)
	want := []string{"one|carbd: refuse #7: policy-refuse: test", "two|carbd: refuse #7: policy-refuse: test"}
	if got := readFrames(t, b); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("frames %q, want %q", got, want)
	}
	if st := s.Stats(); st.Frames != 2 || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// waitTicks lets the stream's loop run n times (on a loaded machine,
// perhaps fewer: only for checking that something did not happen).
func waitTicks(s *Stream, n int) {
	time.Sleep(time.Duration(n) * s.cfg.Tick * 3)
}

// waitFrames waits until the file at path holds n frames (or fails after
// 10 s), and returns its content.
func waitFrames(t *testing.T, path string, n int) []byte {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if len(readFrames(t, b)) >= n || time.Now().After(deadline) {
			return b
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A frame whose verdict never becomes final is written after Delay with
// the annotation it has then; Close writes what is still held back.
func TestStreamDelayAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.pcapng")
	s, err := NewStream(StreamConfig{Path: path, Ifname: "test0", Delay: time.Nanosecond, Tick: 10 * time.Millisecond,
		Annotate: func(Record) Annotation { return Annotation{Verdict: "undecided"} }})
	if err != nil {
		t.Fatal(err)
	}
	s.Add(Record{Time: time.Now(), Data: frame(t, "late"), Dir: Egress})
	b := waitFrames(t, path, 1)
	if got := readFrames(t, b); len(got) != 1 || got[0] != "late|carbd: undecided" {
		t.Fatalf("after the delay: %q", got)
	}
	s2, err := NewStream(StreamConfig{Path: path + "2", Ifname: "test0", Delay: time.Hour, Tick: time.Hour,
		Annotate: func(Record) Annotation { return Annotation{Verdict: "held"} }})
	if err != nil {
		t.Fatal(err)
	}
	s2.Add(Record{Time: time.Now(), Data: frame(t, "pending"), Dir: Egress})
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path + "2")
	if got := readFrames(t, b); len(got) != 1 || got[0] != "pending|carbd: held" {
		t.Fatalf("after close: %q", got)
	}
}

// The cap bounds the file: frames beyond it are counted, not written, and
// the file stays a valid pcapng.
func TestStreamCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.pcapng")
	s, err := NewStream(StreamConfig{Path: path, Ifname: "test0", MaxBytes: 2048, Tick: time.Millisecond,
		Annotate: func(Record) Annotation { return Annotation{Verdict: "release", Final: true} }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		s.Add(Record{Time: time.Now(), Data: frame(t, strings.Repeat("x", 100)), Dir: Egress})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if len(b) > 2048 {
		t.Fatalf("file of %d bytes over its cap of 2048", len(b))
	}
	st := s.Stats()
	if st.Frames == 0 || st.Frames+st.Dropped != 100 || int(st.Frames) != len(readFrames(t, b)) {
		t.Fatalf("stats %+v, file holds %d frames", st, len(readFrames(t, b)))
	}
}

// CopyBlocks exports a file cut inside a block as the whole blocks before
// the cut, which pcapgo (and tshark, where installed) read without error.
func TestCopyBlocksTruncated(t *testing.T) {
	var full bytes.Buffer
	w, err := NewWriter(&full, "test0", LinkTypeEthernet, 65535)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int
	for _, p := range []string{"a", "bb", "ccc"} {
		if err := w.WritePacket(time.Now(), frame(t, p), 0, Egress, Annotation{Verdict: "refuse", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, full.Len())
	}
	for cut := ends[0]; cut <= ends[2]; cut++ {
		var out bytes.Buffer
		st, err := CopyBlocks(&out, bytes.NewReader(full.Bytes()[:cut]))
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		want := 1
		for _, e := range ends[1:] {
			if cut >= e {
				want++
			}
		}
		if st.Packets != want || st.Truncated != (cut != ends[0] && cut != ends[1] && cut != ends[2]) {
			t.Fatalf("cut at %d: %+v, want %d packets", cut, st, want)
		}
		r, err := pcapgo.NewNgReader(bytes.NewReader(out.Bytes()), pcapgo.DefaultNgReaderOptions)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			if _, _, err := r.ReadPacketData(); err != nil {
				break
			}
			n++
		}
		if n != want {
			t.Fatalf("cut at %d: pcapgo reads %d packets, want %d", cut, n, want)
		}
	}
	if tshark, err := exec.LookPath("tshark"); err == nil {
		p := filepath.Join(t.TempDir(), "cut.pcapng")
		var out bytes.Buffer
		if _, err := CopyBlocks(&out, bytes.NewReader(full.Bytes()[:ends[1]+10])); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, out.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := exec.Command(tshark, "-r", p, "-Y", `frame.comment contains "carbd: refuse"`, "-T", "fields", "-e", "frame.number").Output()
		if err != nil || strings.Join(strings.Fields(string(got)), ",") != "1,2" {
			t.Fatalf("tshark: %v\n%s", err, got)
		}
	}
	if _, err := CopyBlocks(&bytes.Buffer{}, strings.NewReader("not a pcapng file at all")); err == nil {
		t.Fatal("CopyBlocks accepted a file that is not pcapng")
	}
}

func FuzzCopyBlocks(f *testing.F) {
	var b bytes.Buffer
	w, _ := NewWriter(&b, "f0", LinkTypeEthernet, 65535)
	_ = w.WriteSecrets(SecretsTLSKeyLog, []byte("CLIENT_RANDOM 01 02\n"))
	_ = w.WritePacket(time.Unix(1, 0), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}, 0, Egress, Annotation{Verdict: "release"})
	f.Add(b.Bytes())
	f.Add(b.Bytes()[:b.Len()-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		st, err := CopyBlocks(&out, bytes.NewReader(in))
		if err != nil {
			return
		}
		// What was copied is a prefix of the input made of whole blocks.
		if !bytes.HasPrefix(in, out.Bytes()) {
			t.Fatal("output is not a prefix of the input")
		}
		var again bytes.Buffer
		st2, err := CopyBlocks(&again, bytes.NewReader(out.Bytes()))
		if err != nil || st2.Truncated || st2.Blocks != st.Blocks || !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("copy of the copy: %+v %v", st2, err)
		}
	})
}

// BenchmarkStream: frames of 1500 bytes through a Stream to a file, each
// final at once (one write(2) per block).
func BenchmarkStream(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.pcapng")
	s, err := NewStream(StreamConfig{Path: path, Ifname: "bench0", MaxBytes: -1, Tick: time.Millisecond,
		Annotate: func(Record) Annotation {
			return Annotation{Verdict: "release", Seq: 1, Reason: "provenance: bench", Final: true}
		}})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 1500)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.Add(Record{Time: time.Now(), Data: data, Dir: Egress})
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if st := s.Stats(); st.Frames != uint64(b.N) {
		b.Fatalf("wrote %d of %d frames", st.Frames, b.N)
	}
}
