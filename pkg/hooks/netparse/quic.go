package netparse

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrQUIC marks a QUIC Initial packet carbd cannot read.
var ErrQUIC = errors.New("netparse: quic initial")

// QUIC versions carbd can decrypt Initial packets of.
const (
	QUICv1 = 0x00000001 // RFC 9000
	QUICv2 = 0x6b3343cf // RFC 9369
)

var (
	saltV1 = []byte{0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f, 0x0a}
	saltV2 = []byte{0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd, 0x2e, 0xd9}
)

// QUICInitial is what carbd reads from a client's QUIC Initial packet.
type QUICInitial struct {
	Version      uint32
	DCID, SCID   []byte
	Token        []byte
	PacketNumber uint64
	// Hello is the ClientHello when HelloOK.
	Hello   ClientHello
	HelloOK bool
	// Opaque says why the ClientHello could not be read: decryption
	// failed, or it does not fit in this packet.
	Opaque error
}

func (q *QUICInitial) reset() {
	h := q.Hello
	h.reset()
	*q = QUICInitial{Hello: h}
}

// initialKeys are the client Initial packet protection keys.
type initialKeys struct {
	dcid []byte
	ver  uint32
	aead cipher.AEAD
	iv   [12]byte
	hp   cipher.Block
}

// hkdfExpandLabel is TLS 1.3's HKDF-Expand-Label (RFC 8446 §7.1) with an
// empty context.
func hkdfExpandLabel(secret []byte, label string, n int) ([]byte, error) {
	full := "tls13 " + label
	info := make([]byte, 0, 4+len(full))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(len(full)))
	info = append(info, full...)
	info = append(info, 0)
	return hkdf.Expand(sha256.New, secret, string(info), n)
}

// quicSecrets derives the client Initial secret and its key, IV and
// header protection key (RFC 9001 §5.2, RFC 9369 §3.3).
func quicSecrets(ver uint32, dcid []byte) (secret, key, iv, hp []byte, err error) {
	salt, prefix := saltV1, "quic "
	if ver == QUICv2 {
		salt, prefix = saltV2, "quicv2 "
	}
	initial, err := hkdf.Extract(sha256.New, dcid, salt)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if secret, err = hkdfExpandLabel(initial, "client in", 32); err != nil {
		return
	}
	if key, err = hkdfExpandLabel(secret, prefix+"key", 16); err != nil {
		return
	}
	if iv, err = hkdfExpandLabel(secret, prefix+"iv", 12); err != nil {
		return
	}
	hp, err = hkdfExpandLabel(secret, prefix+"hp", 16)
	return
}

func newInitialKeys(ver uint32, dcid []byte) (*initialKeys, error) {
	_, key, iv, hp, err := quicSecrets(ver, dcid)
	if err != nil {
		return nil, err
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	hpb, err := aes.NewCipher(hp)
	if err != nil {
		return nil, err
	}
	k := &initialKeys{dcid: append([]byte(nil), dcid...), ver: ver, aead: aead, hp: hpb}
	copy(k.iv[:], iv)
	return k, nil
}

// quicDecoder decrypts client Initial packets. It keeps the keys of the
// last connection ID (clients resend Initials with the same one) and
// scratch buffers; not safe for concurrent use.
type quicDecoder struct {
	keys    *initialKeys
	scratch []byte
	plain   []byte
	crypto  []byte
	have    []bool
	frags   []cryptoFrag
	mask    [16]byte // kept here: passed to interfaces, they would escape
	nonce   [12]byte
}

type cryptoFrag struct {
	off  uint64
	data []byte
}

// isQUICLong reports whether a UDP payload starts like a QUIC long header
// of a version carbd knows, and whether it is an Initial.
func isQUICLong(b []byte) (initial, known bool) {
	if len(b) < 7 || b[0]&0x80 == 0 {
		return false, false
	}
	ver := binary.BigEndian.Uint32(b[1:5])
	typ := (b[0] >> 4) & 3
	switch ver {
	case QUICv1:
		return typ == 0, true
	case QUICv2:
		return typ == 1, true
	}
	return false, false
}

// varint reads a QUIC variable-length integer (RFC 9000 §16).
func varint(b []byte) (uint64, int, bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	n := 1 << (b[0] >> 6)
	if len(b) < n {
		return 0, 0, false
	}
	v := uint64(b[0] & 0x3f)
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
	}
	return v, n, true
}

// parse reads the first packet of the datagram, which must be a v1 or v2
// Initial. A header it cannot read is an error; a packet it cannot
// decrypt, or whose ClientHello is not whole in this packet, sets
// q.Opaque. The datagram is not modified.
func (d *quicDecoder) parse(b []byte, q *QUICInitial) error {
	q.reset()
	if initial, known := isQUICLong(b); !known || !initial {
		return fmt.Errorf("%w: not a v1 or v2 initial packet", ErrQUIC)
	}
	q.Version = binary.BigEndian.Uint32(b[1:5])
	off := 5
	dl := int(b[off])
	off++
	if dl > 20 || len(b) < off+dl+1 {
		return fmt.Errorf("%w: destination connection id length %d", ErrQUIC, dl)
	}
	q.DCID = b[off : off+dl]
	off += dl
	sl := int(b[off])
	off++
	if sl > 20 || len(b) < off+sl {
		return fmt.Errorf("%w: source connection id length %d", ErrQUIC, sl)
	}
	q.SCID = b[off : off+sl]
	off += sl
	tl, n, ok := varint(b[off:])
	if !ok || uint64(len(b)-off-n) < tl {
		return fmt.Errorf("%w: token length", ErrQUIC)
	}
	off += n
	q.Token = b[off : off+int(tl)]
	off += int(tl)
	length, n, ok := varint(b[off:])
	if !ok || uint64(len(b)-off-n) < length {
		return fmt.Errorf("%w: packet length %d exceeds the datagram", ErrQUIC, length)
	}
	off += n
	pnOff := off
	end := pnOff + int(length)
	if length < 20 {
		return fmt.Errorf("%w: packet length %d too short to sample", ErrQUIC, length)
	}
	if d.keys == nil || d.keys.ver != q.Version || !bytes.Equal(d.keys.dcid, q.DCID) {
		k, err := newInitialKeys(q.Version, q.DCID)
		if err != nil {
			return fmt.Errorf("%w: derive keys: %v", ErrQUIC, err)
		}
		d.keys = k
	}
	k := d.keys
	// Remove header protection on a copy: the packet itself may be
	// reinjected unchanged.
	d.scratch = append(d.scratch[:0], b[:end]...)
	pkt := d.scratch
	mask := d.mask[:]
	k.hp.Encrypt(mask, pkt[pnOff+4:pnOff+20])
	pkt[0] ^= mask[0] & 0x0f
	pnLen := int(pkt[0]&3) + 1
	var pn uint64
	for i := 0; i < pnLen; i++ {
		pkt[pnOff+i] ^= mask[1+i]
		pn = pn<<8 | uint64(pkt[pnOff+i])
	}
	q.PacketNumber = pn
	nonce := d.nonce[:]
	copy(nonce, k.iv[:])
	for i := 0; i < 8; i++ {
		nonce[11-i] ^= byte(pn >> (8 * i))
	}
	hdr := pkt[:pnOff+pnLen]
	plain, err := k.aead.Open(d.plain[:0], nonce, pkt[pnOff+pnLen:end], hdr)
	if err != nil {
		q.Opaque = fmt.Errorf("%w: decryption failed", ErrQUIC)
		return nil
	}
	d.plain = plain
	if err := d.readCrypto(plain); err != nil {
		q.Opaque = err
		return nil
	}
	msg, err := d.cryptoStream()
	if err != nil {
		q.Opaque = err
		return nil
	}
	if err := parseClientHelloMsg(msg, &q.Hello); err != nil {
		q.Opaque = err
		return nil
	}
	q.HelloOK = true
	return nil
}

// readCrypto collects the CRYPTO frames of a decrypted Initial payload.
func (d *quicDecoder) readCrypto(p []byte) error {
	d.frags = d.frags[:0]
	for len(p) > 0 {
		typ, n, ok := varint(p)
		if !ok {
			return fmt.Errorf("%w: frame type", ErrQUIC)
		}
		p = p[n:]
		switch typ {
		case 0x00, 0x01: // PADDING, PING
		case 0x02, 0x03: // ACK
			var fields [4]uint64
			for i := range fields {
				if fields[i], n, ok = varint(p); !ok {
					return fmt.Errorf("%w: ack frame", ErrQUIC)
				}
				p = p[n:]
			}
			for i := uint64(0); i < 2*fields[2]; i++ {
				if _, n, ok = varint(p); !ok {
					return fmt.Errorf("%w: ack range", ErrQUIC)
				}
				p = p[n:]
			}
			if typ == 0x03 {
				for i := 0; i < 3; i++ {
					if _, n, ok = varint(p); !ok {
						return fmt.Errorf("%w: ack ecn counts", ErrQUIC)
					}
					p = p[n:]
				}
			}
		case 0x06: // CRYPTO
			off, n, ok := varint(p)
			if !ok {
				return fmt.Errorf("%w: crypto offset", ErrQUIC)
			}
			p = p[n:]
			l, n, ok := varint(p)
			if !ok || uint64(len(p)-n) < l {
				return fmt.Errorf("%w: crypto length", ErrQUIC)
			}
			p = p[n:]
			d.frags = append(d.frags, cryptoFrag{off: off, data: p[:l]})
			p = p[l:]
		case 0x1c: // CONNECTION_CLOSE
			return fmt.Errorf("%w: connection close", ErrQUIC)
		default:
			return fmt.Errorf("%w: frame type %#x not allowed in an initial packet", ErrQUIC, typ)
		}
	}
	return nil
}

// cryptoStream joins the CRYPTO frames (they may come in any order and
// overlap only with equal bytes) and returns the first handshake message
// if it is whole.
func (d *quicDecoder) cryptoStream() ([]byte, error) {
	var end uint64
	for _, f := range d.frags {
		end = max(end, f.off+uint64(len(f.data)))
	}
	if end == 0 {
		return nil, fmt.Errorf("%w: no crypto data", ErrQUIC)
	}
	if end > 1<<16 {
		return nil, fmt.Errorf("%w: crypto data beyond %d bytes", ErrQUIC, 1<<16)
	}
	if cap(d.crypto) < int(end) {
		d.crypto = make([]byte, end)
		d.have = make([]bool, end)
	}
	buf := d.crypto[:end]
	// have marks which bytes were written.
	have := d.have[:end]
	clear(have)
	for _, f := range d.frags {
		for i, c := range f.data {
			at := f.off + uint64(i)
			if have[at] && buf[at] != c {
				return nil, fmt.Errorf("%w: crypto frames overlap with different data", ErrQUIC)
			}
			buf[at], have[at] = c, true
		}
	}
	n := 0
	for n < len(have) && have[n] {
		n++
	}
	if n < 4 {
		return nil, fmt.Errorf("%w: clienthello starts in another packet", ErrQUIC)
	}
	want := 4 + (int(buf[1])<<16 | int(buf[2])<<8 | int(buf[3]))
	if n < want {
		return nil, fmt.Errorf("%w: clienthello spans several initial packets (%d of %d bytes here)", ErrQUIC, n, want)
	}
	return buf[:want], nil
}
