package calib

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"

	"github.com/carbd/carbd/pkg/decide"
)

// FieldRecord is one calibration field: a field of an effect seen in a
// recorded episode, with its role, its score (package score, in [0,1],
// larger = more untrusted influence) and its ground-truth labels.
// Violated means untrusted input set the value against the user's intent;
// such a violation is attack-induced, so a violated field is attacked.
type FieldRecord struct {
	Role     decide.Role `json:"role"`
	Score    float64     `json:"score"`
	Violated bool        `json:"violated"`
	Episode  string      `json:"episode,omitempty"`
	Attacked bool        `json:"attacked"`
}

// MaxFieldLine is the longest line a field file may have.
const MaxFieldLine = 1 << 20

// check reports what is wrong with a record, or nil.
func (f *FieldRecord) check() error {
	if !slices.Contains(decide.Roles, f.Role) {
		return fmt.Errorf("unknown role %d", uint8(f.Role))
	}
	if !(f.Score >= 0 && f.Score <= 1) {
		return fmt.Errorf("score %v outside [0,1]", f.Score)
	}
	if f.Violated && !f.Attacked {
		return errors.New("violated but not attacked (violations are attack-induced)")
	}
	return nil
}

// DecodeFields reads a field file: JSON lines, one object per line with
// the keys role (a role name), score (a number in [0,1]), violated and
// attacked (booleans) and optionally episode (a string). Blank lines are
// skipped. Unknown keys, missing keys, unknown roles, scores outside
// [0,1] and violated-but-not-attacked records are errors naming name and
// the line. Keys are matched exactly; a repeated key keeps its last value.
func DecodeFields(r io.Reader, name string) ([]FieldRecord, error) {
	var out []FieldRecord
	br := bufio.NewReaderSize(r, 64<<10)
	var long []byte
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) && len(long) <= MaxFieldLine {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			if len(long) > MaxFieldLine {
				return nil, fmt.Errorf("calib: %s:%d: line longer than %d bytes", name, lineNo, MaxFieldLine)
			}
			line = long
		}
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("calib: %s:%d: %w", name, lineNo, err)
		}
		if len(bytes.TrimSpace(line)) > 0 {
			rec, perr := parseFieldLine(line)
			if perr != nil {
				return nil, fmt.Errorf("calib: %s:%d: %w", name, lineNo, perr)
			}
			out = append(out, rec)
		}
		if err == io.EOF {
			return out, nil
		}
	}
}

// parseFieldLine parses and checks one non-blank line.
func parseFieldLine(line []byte) (FieldRecord, error) {
	fl, err := scanFieldLine(line)
	if err != nil {
		return FieldRecord{}, err
	}
	return fl.record()
}

// record checks that the required keys are present and the values valid.
func (fl *fieldLine) record() (FieldRecord, error) {
	var missing []string
	for _, k := range []struct {
		bit  uint8
		name string
	}{{hasRole, "role"}, {hasScore, "score"}, {hasViolated, "violated"}, {hasAttacked, "attacked"}} {
		if fl.has&k.bit == 0 {
			missing = append(missing, k.name)
		}
	}
	if len(missing) > 0 {
		return FieldRecord{}, fmt.Errorf("missing %q", missing)
	}
	role, err := decide.ParseRole(fl.role)
	if err != nil {
		return FieldRecord{}, err
	}
	rec := FieldRecord{Role: role, Score: fl.score, Violated: fl.violated, Attacked: fl.attacked, Episode: fl.episode}
	if err := rec.check(); err != nil {
		return FieldRecord{}, err
	}
	return rec, nil
}

// ReadFieldsFile reads a field file and describes it for the artifact's
// Source: its path, its SHA-256 and the number of records.
func ReadFieldsFile(path string) ([]FieldRecord, SourceFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, SourceFile{}, fmt.Errorf("calib: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	recs, err := DecodeFields(io.TeeReader(f, h), path)
	if err != nil {
		return nil, SourceFile{}, err
	}
	return recs, SourceFile{Path: path, SHA256: hex.EncodeToString(h.Sum(nil)), Records: len(recs)}, nil
}

// WriteFields writes records in the field-file format DecodeFields reads.
func WriteFields(w io.Writer, recs []FieldRecord) error {
	bw := bufio.NewWriter(w)
	for i := range recs {
		if err := recs[i].check(); err != nil {
			return fmt.Errorf("calib: field %d: %w", i+1, err)
		}
		b, err := json.Marshal(&recs[i])
		if err != nil {
			return fmt.Errorf("calib: field %d: %w", i+1, err)
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// finite reports whether x is a finite number.
func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
