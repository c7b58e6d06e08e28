package calib

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// fieldLine is one field-file line as written; has records which keys
// were present with a non-null value.
type fieldLine struct {
	role, episode      string
	score              float64
	violated, attacked bool
	has                uint8
}

const (
	hasRole uint8 = 1 << iota
	hasScore
	hasViolated
	hasAttacked
	hasEpisode
)

// scanFieldLine parses one line holding a flat JSON object with the
// field-file keys. It is a strict, allocation-light JSON reader for this
// one shape (encoding/json costs several times more per line): exact key
// names, no unknown keys, no trailing data; strings with escapes or
// non-ASCII bytes are decoded by encoding/json so their meaning is JSON's.
// A differential fuzz test holds it to encoding/json's reading.
func scanFieldLine(b []byte) (fieldLine, error) {
	var fl fieldLine
	p := scanner{b: b}
	p.ws()
	if !p.eat('{') {
		return fl, p.errorf("want an object")
	}
	p.ws()
	if p.eat('}') {
		return fl, p.end()
	}
	for {
		p.ws()
		key, err := p.str()
		if err != nil {
			return fl, err
		}
		p.ws()
		if !p.eat(':') {
			return fl, p.errorf("want ':' after key %q", key)
		}
		p.ws()
		null := p.lit("null")
		switch key {
		case "role", "episode":
			var s string
			if !null {
				if s, err = p.str(); err != nil {
					return fl, fmt.Errorf("key %q: %w", key, err)
				}
			}
			if key == "role" {
				fl.role = s
				fl.has = set(fl.has, hasRole, !null)
			} else {
				fl.episode = s
				fl.has = set(fl.has, hasEpisode, !null)
			}
		case "score":
			var x float64
			if !null {
				if x, err = p.num(); err != nil {
					return fl, fmt.Errorf("key %q: %w", key, err)
				}
			}
			fl.score = x
			fl.has = set(fl.has, hasScore, !null)
		case "violated", "attacked":
			var v bool
			if !null {
				switch {
				case p.lit("true"):
					v = true
				case p.lit("false"):
				default:
					return fl, fmt.Errorf("key %q: %w", key, p.errorf("want true or false"))
				}
			}
			if key == "violated" {
				fl.violated = v
				fl.has = set(fl.has, hasViolated, !null)
			} else {
				fl.attacked = v
				fl.has = set(fl.has, hasAttacked, !null)
			}
		default:
			return fl, fmt.Errorf("unknown key %q", key)
		}
		p.ws()
		if p.eat(',') {
			continue
		}
		if p.eat('}') {
			return fl, p.end()
		}
		return fl, p.errorf("want ',' or '}'")
	}
}

// set sets or clears bit in has. A null value counts as absent.
func set(has, bit uint8, on bool) uint8 {
	if on {
		return has | bit
	}
	return has &^ bit
}

type scanner struct {
	b []byte
	i int
}

func (p *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("byte %d: "+format, append([]any{p.i + 1}, args...)...)
}

func (p *scanner) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *scanner) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// lit consumes the literal word if it is next and not followed by more
// letters.
func (p *scanner) lit(w string) bool {
	if len(p.b)-p.i >= len(w) && string(p.b[p.i:p.i+len(w)]) == w {
		if j := p.i + len(w); j < len(p.b) && isAlnum(p.b[j]) {
			return false
		}
		p.i += len(w)
		return true
	}
	return false
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

func (p *scanner) end() error {
	p.ws()
	if p.i != len(p.b) {
		return p.errorf("more than one JSON value on the line")
	}
	return nil
}

// str reads a JSON string.
func (p *scanner) str() (string, error) {
	if !p.eat('"') {
		return "", p.errorf("want a string")
	}
	start, plain := p.i, true
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			if plain {
				return string(p.b[start : p.i-1]), nil
			}
			var s string
			if err := json.Unmarshal(p.b[start-1:p.i], &s); err != nil {
				return "", p.errorf("%v", err)
			}
			return s, nil
		case c == '\\':
			plain = false
			p.i += 2
		case c < 0x20:
			return "", p.errorf("control character in string")
		default:
			if c >= utf8.RuneSelf {
				plain = false
			}
			p.i++
		}
	}
	return "", p.errorf("unterminated string")
}

// num reads a JSON number as a float64.
func (p *scanner) num() (float64, error) {
	start := p.i
	p.eat('-')
	switch {
	case p.eat('0'):
	case p.i < len(p.b) && '1' <= p.b[p.i] && p.b[p.i] <= '9':
		p.digits()
	default:
		return 0, p.errorf("want a number")
	}
	if p.eat('.') && !p.digits() {
		return 0, p.errorf("want digits after '.'")
	}
	if p.eat('e') || p.eat('E') {
		if !p.eat('+') {
			p.eat('-')
		}
		if !p.digits() {
			return 0, p.errorf("want digits in exponent")
		}
	}
	x, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("number %s out of range", p.b[start:p.i])
		}
		return 0, p.errorf("%v", err)
	}
	return x, nil
}

func (p *scanner) digits() bool {
	s := p.i
	for p.i < len(p.b) && '0' <= p.b[p.i] && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > s
}
