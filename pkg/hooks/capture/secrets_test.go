package capture

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/google/gopacket/pcapgo"
)

// blocks splits a pcapng stream into its blocks (type, body without the
// leading type and length and the trailing length), checking that each
// block's two lengths agree and are multiples of 4.
func blocks(t *testing.T, b []byte) (types []uint32, bodies [][]byte) {
	t.Helper()
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("truncated block: %x", b)
		}
		typ, n := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
		if n%4 != 0 || int(n) > len(b) || n < 12 {
			t.Fatalf("block %#x: length %d of %d bytes", typ, n, len(b))
		}
		if tail := binary.LittleEndian.Uint32(b[n-4:]); tail != n {
			t.Fatalf("block %#x: trailing length %d, leading %d", typ, tail, n)
		}
		types, bodies = append(types, typ), append(bodies, b[8:n-4])
		b = b[n:]
	}
	return types, bodies
}

// A Decryption Secrets Block as the pcapng specification lays it out
// (type 0x0A; secrets type, secrets length, the secrets padded to 32
// bits), before the packets; a reader that does not know it skips it.
func TestDecryptionSecretsBlock(t *testing.T) {
	for _, keylog := range []string{"CLIENT_RANDOM 0a0b 0c0d\n", "CLIENT_HANDSHAKE_TRAFFIC_SECRET 01 02\nSERVER_HANDSHAKE_TRAFFIC_SECRET 01 03\n"} {
		var b bytes.Buffer
		w, err := NewWriter(&b, "cbh-demo", LinkTypeEthernet, 65535)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteSecrets(SecretsTLSKeyLog, []byte(keylog)); err != nil {
			t.Fatal(err)
		}
		if err := w.WritePacket(time.Unix(1700000000, 0), tcpFrame(t, "192.0.2.10", "x"), 0, Egress, Annotation{}); err != nil {
			t.Fatal(err)
		}
		types, bodies := blocks(t, b.Bytes())
		if want := []uint32{blockSHB, blockIDB, 0x0000000A, blockEPB}; len(types) != len(want) || types[2] != want[2] || types[3] != want[3] {
			t.Fatalf("blocks %x, want %x", types, want)
		}
		dsb := bodies[2]
		if typ := binary.LittleEndian.Uint32(dsb); typ != 0x544c534b {
			t.Errorf("secrets type %#x, want 0x544c534b (TLSK)", typ)
		}
		n := binary.LittleEndian.Uint32(dsb[4:])
		if int(n) != len(keylog) || string(dsb[8:8+n]) != keylog {
			t.Errorf("secrets %q (length %d), want %q", dsb[8:], n, keylog)
		}
		if pad := len(dsb) - 8 - int(n); pad < 0 || pad > 3 || !bytes.Equal(dsb[8+n:], make([]byte, pad)) {
			t.Errorf("padding %x", dsb[8+n:])
		}
		r, err := pcapgo.NewNgReader(bytes.NewReader(b.Bytes()), pcapgo.DefaultNgReaderOptions)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := r.ReadPacketData(); err != nil {
			t.Errorf("pcapgo after the secrets block: %v", err)
		}
	}
}
