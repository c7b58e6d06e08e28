package capture

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// The key log a Capture keeps is bounded: the oldest whole lines go.
func TestKeyLogBounded(t *testing.T) {
	c := &Capture{}
	w := c.KeyLog()
	line := func(i int) string { return fmt.Sprintf("CLIENT_RANDOM %064x %096x\n", i, i) }
	n := MaxKeyLogBytes/len(line(0)) + 100
	for i := 0; i < n; i++ {
		if _, err := w.Write([]byte(line(i))); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.keylog) > MaxKeyLogBytes {
		t.Errorf("kept %d bytes, bound %d", len(c.keylog), MaxKeyLogBytes)
	}
	if !strings.HasPrefix(string(c.keylog), "CLIENT_RANDOM ") || !bytes.HasSuffix(c.keylog, []byte(line(n-1))) {
		t.Errorf("kept lines do not start whole or lost the newest: %q ... %q", c.keylog[:40], c.keylog[len(c.keylog)-40:])
	}
	if bytes.Contains(c.keylog, []byte(line(0))) {
		t.Errorf("the oldest line was kept")
	}
}
