// Package capture records a sandbox's traffic on the host side of its
// interface and exports it as pcapng in which every packet of a decided
// flow carries carbd's verdict and reason: as a packet comment
// (opt_comment) and as the pcapng verdict option (epb_verdict, type
// Linux eBPF TC, with the TC action: TC_ACT_OK for released, TC_ACT_SHOT
// for refused), so `tshark -T fields -e frame.comment` shows why. TLS
// key log lines given to the Capture (the interception's guest leg) come
// as a Decryption Secrets Block (type 0x0A, secrets type TLSK) ahead of
// the packets, so `tshark -r` shows intercepted HTTPS decrypted.
//
// # Requirements
//
// Capturing needs an AF_PACKET socket (CAP_NET_RAW) in the interface's
// network namespace. The pcapng writer is pure and writes to any
// io.Writer; gopacket's pcapgo (v1.1.19) has no per-packet options, so
// the Enhanced Packet Blocks are written here, following the pcapng
// specification (draft-ietf-opsawg-pcapng), and read back with pcapgo and
// tshark in tests.
package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Block types and option codes of pcapng.
const (
	blockSHB = 0x0A0D0D0A
	blockIDB = 0x00000001
	blockEPB = 0x00000006
	blockDSB = 0x0000000A

	byteOrderMagic = 0x1A2B3C4D

	optEnd       = 0
	optComment   = 1
	optShbOS     = 3
	optShbApp    = 4
	optIfName    = 2
	optIfTsresol = 9
	optEpbFlags  = 2
	optEpbVerdct = 7

	// LinkTypeEthernet is DLT_EN10MB; LinkTypeRaw is raw IPv4/IPv6.
	LinkTypeEthernet = 1
	LinkTypeRaw      = 101

	// SecretsTLSKeyLog is the Decryption Secrets Block's secrets type for
	// TLS key log lines in the NSS format (SSLKEYLOGFILE).
	SecretsTLSKeyLog = 0x544c534b

	verdictTypeTC = 1 // epb_verdict type: Linux eBPF TC
	tcActOK       = 0
	tcActShot     = 2
)

// Direction of a packet relative to the sandbox.
type Direction uint8

const (
	Unknown Direction = iota
	Egress            // sandbox -> world
	Ingress           // world -> sandbox
)

// Annotation is what carbd says about a packet.
type Annotation struct {
	Verdict string // "release", "refuse", "held", "undecided", "fast-path"
	Reason  string // the decision's reason code and justification
	Seq     uint64 // the decision's sequence number in the audit log
	// Final says the verdict will not change (a Stream writes the frame
	// now rather than waiting); it is not written to the file.
	Final bool
}

// Writer writes a pcapng stream: one section, one interface.
type Writer struct {
	w   io.Writer
	buf []byte
}

// NewWriter writes the section header and the interface description.
func NewWriter(w io.Writer, ifname string, linkType uint16, snaplen uint32) (*Writer, error) {
	pw := &Writer{w: w}
	// Section Header Block.
	var opts []byte
	opts = appendOpt(opts, optShbApp, []byte("carbd"))
	b := make([]byte, 0, 64)
	b = le32(b, blockSHB)
	b = le32(b, 0) // length, patched
	b = le32(b, byteOrderMagic)
	b = le16(b, 1)
	b = le16(b, 0)
	b = le64(b, 0xFFFFFFFFFFFFFFFF) // section length unknown
	b = append(b, opts...)
	b = le16(b, optEnd)
	b = le16(b, 0)
	b = finish(b)
	// Interface Description Block, nanosecond timestamps.
	var io_ []byte
	io_ = appendOpt(io_, optIfName, []byte(ifname))
	io_ = appendOpt(io_, optIfTsresol, []byte{9})
	i := make([]byte, 0, 64)
	i = le32(i, blockIDB)
	i = le32(i, 0)
	i = le16(i, linkType)
	i = le16(i, 0)
	i = le32(i, snaplen)
	i = append(i, io_...)
	i = le16(i, optEnd)
	i = le16(i, 0)
	i = finish(i)
	if _, err := w.Write(append(b, i...)); err != nil {
		return nil, err
	}
	return pw, nil
}

// WritePacket writes one Enhanced Packet Block with its annotation.
func (pw *Writer) WritePacket(ts time.Time, data []byte, origLen int, dir Direction, a Annotation) error {
	if origLen < len(data) {
		origLen = len(data)
	}
	ns := uint64(ts.UnixNano())
	b := pw.buf[:0]
	b = le32(b, blockEPB)
	b = le32(b, 0)
	b = le32(b, 0) // interface 0
	b = le32(b, uint32(ns>>32))
	b = le32(b, uint32(ns))
	b = le32(b, uint32(len(data)))
	b = le32(b, uint32(origLen))
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	if dir != Unknown {
		// epb_flags bits 0-1: 01 inbound, 10 outbound (relative to the
		// capturing interface: the sandbox's egress is inbound on the host
		// side of its interface).
		var f [4]byte
		if dir == Egress {
			binary.LittleEndian.PutUint32(f[:], 1)
		} else {
			binary.LittleEndian.PutUint32(f[:], 2)
		}
		b = appendOpt(b, optEpbFlags, f[:])
	}
	if a.Verdict != "" {
		c := "carbd: " + a.Verdict
		if a.Seq != 0 {
			c += fmt.Sprintf(" #%d", a.Seq)
		}
		if a.Reason != "" {
			c += ": " + a.Reason
		}
		b = appendOpt(b, optComment, []byte(c))
		switch a.Verdict {
		case "release", "fast-path":
			b = appendOpt(b, optEpbVerdct, verdictTC(tcActOK))
		case "refuse":
			b = appendOpt(b, optEpbVerdct, verdictTC(tcActShot))
		}
	}
	b = le16(b, optEnd)
	b = le16(b, 0)
	b = finish(b)
	pw.buf = b
	_, err := pw.w.Write(b)
	return err
}

// WriteSecrets writes a Decryption Secrets Block: typ (SecretsTLSKeyLog)
// and its data, which readers apply to the packets after it, so it is
// written before them.
func (pw *Writer) WriteSecrets(typ uint32, data []byte) error {
	if uint64(len(data)) > 1<<31 {
		return errors.New("capture: decryption secrets too long")
	}
	b := make([]byte, 0, 24+len(data))
	b = le32(b, blockDSB)
	b = le32(b, 0)
	b = le32(b, typ)
	b = le32(b, uint32(len(data)))
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = finish(b)
	_, err := pw.w.Write(b)
	return err
}

func verdictTC(act uint64) []byte {
	v := make([]byte, 9)
	v[0] = verdictTypeTC
	binary.LittleEndian.PutUint64(v[1:], act)
	return v
}

// ErrTooLong is returned for an option longer than pcapng allows.
var ErrTooLong = errors.New("capture: pcapng option longer than 65535 bytes")

func appendOpt(b []byte, code uint16, v []byte) []byte {
	if len(v) > 0xFFFF {
		v = v[:0xFFFF]
	}
	b = le16(b, code)
	b = le16(b, uint16(len(v)))
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// finish appends the trailing block length and patches the leading one.
func finish(b []byte) []byte {
	n := uint32(len(b) + 4)
	binary.LittleEndian.PutUint32(b[4:8], n)
	return le32(b, n)
}

func le16(b []byte, v uint16) []byte { return binary.LittleEndian.AppendUint16(b, v) }
func le32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func le64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }
