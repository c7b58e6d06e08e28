package decide

import (
	"strings"
)

// packedTypes are media types of compressed or archived data: their
// bytes hide what they carry from the value scan.
var packedTypes = []string{
	"application/x-git-receive-pack-request", // a git push: a zlib-compressed pack
	"application/gzip", "application/x-gzip", "application/zip", "application/x-zip-compressed",
	"application/zstd", "application/x-bzip2", "application/x-xz", "application/x-7z-compressed",
	"application/x-tar", "application/x-compressed-tar", "application/java-archive",
}

// packedMagic are the first bytes of compressed or archived data.
var packedMagic = []string{
	"\x1f\x8b",           // gzip
	"PK\x03\x04",         // zip
	"\x28\xb5\x2f\xfd",   // zstd
	"\xfd7zXZ\x00",       // xz
	"BZh",                // bzip2
	"7z\xbc\xaf\x27\x1c", // 7z
}

// packedContent reports whether an outgoing effect's content is
// compressed or archived (a Content-Encoding, an archive's media type or
// magic bytes, a git pack): the value scan cannot see into it, so, like
// opaque content, it may carry anything the agent read (DESIGN: what
// carbd cannot parse is decided as opaque). A git push of a repository
// holding a private key is the case in point.
func packedContent(ev *Event) bool {
	if ev.Ch != ChanNet {
		return false
	}
	for _, f := range ev.Fields {
		switch f.Name {
		case "header.content-encoding":
			if v := strings.ToLower(strings.TrimSpace(f.Value)); v != "" && v != "identity" {
				return true
			}
		case "header.content-type":
			v := strings.ToLower(f.Value)
			if i := strings.IndexByte(v, ';'); i >= 0 {
				v = v[:i]
			}
			v = strings.TrimSpace(v)
			for _, t := range packedTypes {
				if v == t {
					return true
				}
			}
		}
	}
	c := ev.Content
	for _, m := range packedMagic {
		// The first byte first: this runs for every effect.
		if len(c) >= len(m) && c[0] == m[0] && c[:len(m)] == m {
			return true
		}
	}
	// A git pack inside pkt-lines: "PACK", version 2 or 3.
	if i := strings.Index(c, "PACK\x00\x00\x00"); i >= 0 && i+8 <= len(c) && (c[i+7] == 2 || c[i+7] == 3) {
		return true
	}
	return false
}
