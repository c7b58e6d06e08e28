package netparse

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
)

// rfcVectors reads a testdata file of RFC Appendix A values.
func rfcVectors(t testing.TB, file string) map[string][]byte {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	hexes := map[string]*strings.Builder{}
	var cur *strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		if line[0] != ' ' {
			name, rest, _ := strings.Cut(line, " ")
			cur = &strings.Builder{}
			hexes[name] = cur
			line = rest
		}
		cur.WriteString(strings.ReplaceAll(strings.TrimSpace(line), " ", ""))
	}
	out := map[string][]byte{}
	for k, v := range hexes {
		b, err := hex.DecodeString(v.String())
		if err != nil {
			t.Fatalf("%s %s: %v", file, k, err)
		}
		out[k] = b
	}
	return out
}

// protectInitial is a test-only QUIC Initial encoder following RFC 9001
// §5.3-5.4: AEAD over the payload with the header as associated data,
// then header protection sampled from the ciphertext.
func protectInitial(t testing.TB, ver uint32, dcid, header, payload []byte) (pkt, sample, mask []byte) {
	t.Helper()
	_, key, iv, hp, err := quicSecrets(ver, dcid)
	if err != nil {
		t.Fatal(err)
	}
	pnLen := int(header[0]&3) + 1
	pnOff := len(header) - pnLen
	var pn uint64
	for _, c := range header[pnOff:] {
		pn = pn<<8 | uint64(c)
	}
	nonce := append([]byte(nil), iv...)
	for i := 0; i < 8; i++ {
		nonce[11-i] ^= byte(pn >> (8 * i))
	}
	blk, _ := aes.NewCipher(key)
	gcm, _ := cipher.NewGCM(blk)
	ct := gcm.Seal(nil, nonce, payload, header)
	sample = ct[4-pnLen : 4-pnLen+16]
	hpb, _ := aes.NewCipher(hp)
	m := make([]byte, 16)
	hpb.Encrypt(m, sample)
	h := append([]byte(nil), header...)
	h[0] ^= m[0] & 0x0f
	for i := 0; i < pnLen; i++ {
		h[pnOff+i] ^= m[1+i]
	}
	return append(h, ct...), sample, m[:5]
}

// initialHeader builds a client Initial header for dcid with a 4-byte
// packet number and a Length field for payloadLen bytes of frames.
func initialHeader(ver uint32, dcid []byte, pn uint32, payloadLen int) []byte {
	typ := byte(0)
	if ver == QUICv2 {
		typ = 1
	}
	h := []byte{0xc0 | typ<<4 | 3}
	h = binary.BigEndian.AppendUint32(h, ver)
	h = append(h, byte(len(dcid)))
	h = append(h, dcid...)
	h = append(h, 0, 0) // no source connection id, no token
	h = binary.BigEndian.AppendUint16(h, 0x4000|uint16(4+payloadLen+16))
	return binary.BigEndian.AppendUint32(h, pn)
}

func TestQUICRFCVectors(t *testing.T) {
	for _, file := range []string{"rfc9001-a.txt", "rfc9369-a.txt"} {
		t.Run(file, func(t *testing.T) {
			v := rfcVectors(t, file)
			ver := binary.BigEndian.Uint32(v["version"])
			dcid := v["dcid"]
			salt := saltV1
			if ver == QUICv2 {
				salt = saltV2
			}
			initial, err := hkdf.Extract(sha256.New, dcid, salt)
			if err != nil {
				t.Fatal(err)
			}
			secret, key, iv, hp, err := quicSecrets(ver, dcid)
			if err != nil {
				t.Fatal(err)
			}
			for name, got := range map[string][]byte{"initial_secret": initial, "client_initial_secret": secret, "key": key, "iv": iv, "hp": hp} {
				if !bytes.Equal(got, v[name]) {
					t.Errorf("%s = %x, want %x", name, got, v[name])
				}
			}
			// The encoder reproduces the RFC's protected packet byte for byte.
			payload := make([]byte, 1162)
			copy(payload, v["crypto_frame"])
			pkt, sample, mask := protectInitial(t, ver, dcid, v["header"], payload)
			if !bytes.Equal(sample, v["sample"]) || !bytes.Equal(mask, v["mask"]) {
				t.Errorf("sample %x mask %x, want %x %x", sample, mask, v["sample"], v["mask"])
			}
			if !bytes.Equal(pkt, v["protected"]) {
				t.Fatalf("protected packet differs from the RFC's (first 32 bytes %x)", pkt[:32])
			}
			// The decoder reads the RFC's packet without modifying it.
			in := append([]byte(nil), v["protected"]...)
			var d quicDecoder
			var q QUICInitial
			if err := d.parse(in, &q); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, v["protected"]) {
				t.Fatal("parse modified the packet")
			}
			if !q.HelloOK || q.Opaque != nil {
				t.Fatalf("hello not read: %v", q.Opaque)
			}
			if q.Version != ver || q.PacketNumber != 2 || !bytes.Equal(q.DCID, dcid) {
				t.Errorf("version %#x pn %d dcid %x", q.Version, q.PacketNumber, q.DCID)
			}
			if string(q.Hello.SNI) != "example.com" || len(q.Hello.ALPN) != 1 || string(q.Hello.ALPN[0]) != "alpn" ||
				q.Hello.Version != 0x0304 || !q.Hello.QUIC {
				t.Errorf("hello: sni %q alpn %q version %#x quic %v", q.Hello.SNI, q.Hello.ALPN, q.Hello.Version, q.Hello.QUIC)
			}
		})
	}
}

func TestQUICThroughParser(t *testing.T) {
	v := rfcVectors(t, "rfc9001-a.txt")
	src, dst := ap("10.0.0.2:51000"), ap("198.51.100.9:443")
	p := newParser(t, Config{})
	r := p.Feed(udpPkt(t, src, dst, v["protected"]), Meta{Time: t0})
	if r.Action != Decide || len(r.Effects) != 1 {
		t.Fatalf("%v %v", r.Action, r.Err)
	}
	ev := r.Effects[0].Event()
	if ev.Op != "quic:initial" || ev.Obj != "example.com:443" || ev.Dest.Host != "example.com" || !ev.Opaque {
		t.Fatalf("event %+v", ev)
	}
	// Later datagrams of the connection are encrypted: opaque.
	short := append([]byte{0x41}, bytes.Repeat([]byte{0xab}, 40)...)
	r = p.Feed(udpPkt(t, src, dst, short), Meta{Time: t0})
	if r.Action != Decide || r.Effects[0].Kind != KindUDP || !errors.Is(r.Effects[0].Opaque, ErrOpaqueQUIC) {
		t.Fatalf("short header: %+v", r.Effects)
	}
	// A plain UDP datagram elsewhere is content.
	r = p.Feed(udpPkt(t, src, ap("198.51.100.9:9999"), []byte("plain")), Meta{Time: t0})
	if r.Effects[0].Opaque != nil || string(r.Effects[0].Content) != "plain" {
		t.Fatalf("plain udp: %+v", r.Effects[0])
	}
}

func TestQUICOpaqueCases(t *testing.T) {
	v := rfcVectors(t, "rfc9001-a.txt")
	frame := v["crypto_frame"]
	hello := frame[4:] // CRYPTO type 06, offset 00, length 40f1
	dcid := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	crypto := func(off int, data []byte) []byte {
		b := []byte{0x06}
		b = appendVarint(b, uint64(off))
		b = appendVarint(b, uint64(len(data)))
		return append(b, data...)
	}
	build := func(frames ...[]byte) []byte {
		payload := make([]byte, 1162)
		copy(payload, concat(frames...))
		pkt, _, _ := protectInitial(t, QUICv1, dcid, initialHeader(QUICv1, dcid, 0, len(payload)), payload)
		return pkt
	}
	tests := []struct {
		name    string
		pkt     []byte
		helloOK bool
		why     string
	}{
		{"crypto frames out of order", build([]byte{0x01}, crypto(150, hello[150:]), crypto(0, hello[:60]), crypto(60, hello[60:150])), true, ""},
		{"hello spans packets", build(crypto(0, hello[:100])), false, "spans several"},
		{"hello starts elsewhere", build(crypto(100, hello[100:])), false, "starts in another packet"},
		{"decryption fails", func() []byte { b := build(crypto(0, hello)); b[200] ^= 1; return b }(), false, "decryption failed"},
		{"overlapping crypto data differs", build(crypto(0, hello), crypto(10, []byte("XXXX"))), false, "overlap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d quicDecoder
			var q QUICInitial
			if err := d.parse(tc.pkt, &q); err != nil {
				t.Fatal(err)
			}
			if q.HelloOK != tc.helloOK {
				t.Fatalf("helloOK %v (%v)", q.HelloOK, q.Opaque)
			}
			if tc.helloOK && string(q.Hello.SNI) != "example.com" {
				t.Fatalf("sni %q", q.Hello.SNI)
			}
			if !tc.helloOK && (q.Opaque == nil || !strings.Contains(q.Opaque.Error(), tc.why)) {
				t.Fatalf("opaque %v, want %q", q.Opaque, tc.why)
			}
		})
	}
	// A header that is not a QUIC Initial at all is an error.
	var d quicDecoder
	var q QUICInitial
	if err := d.parse([]byte{0xc0, 0, 0, 0, 1, 21}, &q); !errors.Is(err, ErrQUIC) {
		t.Fatalf("bad header: %v", err)
	}
}

func appendVarint(b []byte, v uint64) []byte {
	switch {
	case v < 1<<6:
		return append(b, byte(v))
	case v < 1<<14:
		return binary.BigEndian.AppendUint16(b, 0x4000|uint16(v))
	case v < 1<<30:
		return binary.BigEndian.AppendUint32(b, 0x80000000|uint32(v))
	}
	return binary.BigEndian.AppendUint64(b, 0xc000000000000000|v)
}
