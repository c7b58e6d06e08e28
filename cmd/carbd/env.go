package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unsafe"

	"github.com/carbd/carbd/pkg/decide"
)

// envVar is one variable of the agent's environment given with --env or
// --env-file. Its value is a credential bound to the destinations the
// policy's credentials section and Hosts name (docs/policy.md).
type envVar struct {
	Name, Value string
	Hosts       []string // --env NAME=VALUE@host,host; "*": plain environment
	// Inline: the value was written on carbd's command line (and is
	// scrubbed from it).
	Inline bool
}

// envFlag collects --env NAME[=VALUE][@host[,host]] (repeatable). NAME
// alone takes carbd's own value of NAME, as docker run -e does. The text
// after the last '@' of a NAME=VALUE is always the binding: a value that
// contains '@' goes in an --env-file or in carbd's environment.
type envFlag struct {
	vars   []envVar
	lookup func(string) (string, bool) // os.LookupEnv
}

func (f *envFlag) String() string { return "" }

func (f *envFlag) Set(s string) error {
	v, err := parseEnvArg(s, f.lookup)
	if err != nil {
		return err
	}
	f.vars = append(f.vars, v)
	return nil
}

func parseEnvArg(s string, lookup func(string) (string, bool)) (envVar, error) {
	i := strings.IndexAny(s, "=@")
	name := s
	if i >= 0 {
		name = s[:i]
	}
	if !decide.ValidEnvName(name) {
		return envVar{}, fmt.Errorf("want NAME[=VALUE][@host[,host]] with NAME an environment variable name, got %q", clipArg(name))
	}
	v := envVar{Name: name}
	var binding string
	switch {
	case i < 0:
	case s[i] == '@':
		binding = s[i+1:]
	default: // '='
		// A copy: the flag's text is scrubbed from carbd's command line.
		val := strings.Clone(s[i+1:])
		if at := strings.LastIndexByte(val, '@'); at >= 0 {
			val, binding = val[:at], val[at+1:]
			if binding == "" {
				return envVar{}, fmt.Errorf("--env %s: empty binding after '@' (want NAME=VALUE@host[,host])", name)
			}
		}
		v.Value, v.Inline = val, true
	}
	if i >= 0 && s[i] == '@' && binding == "" {
		return envVar{}, fmt.Errorf("--env %s: empty binding after '@' (want NAME@host[,host])", name)
	}
	if binding != "" {
		for _, h := range strings.Split(binding, ",") {
			h = strings.TrimSpace(h)
			if h == "" {
				return envVar{}, fmt.Errorf("--env %s: empty host in the binding", name)
			}
			v.Hosts = append(v.Hosts, h)
		}
	}
	if !v.Inline {
		val, ok := lookup(name)
		if !ok {
			return envVar{}, fmt.Errorf("--env %s: %s is not set in carbd's environment (give NAME=VALUE, or use --env-file)", name, name)
		}
		v.Value = val
	}
	return v, nil
}

func clipArg(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// maxEnvFile bounds an --env-file.
const maxEnvFile = 1 << 20

// readEnvFile reads an --env-file: NAME=VALUE lines; blank lines and
// lines starting with '#' are skipped, an "export " prefix is allowed,
// and a value wholly in single or double quotes loses them (nothing is
// expanded). Errors name FILE:LINE and never quote a value.
func readEnvFile(path string) ([]envVar, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxEnvFile+1)); err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	if buf.Len() > maxEnvFile {
		return nil, fmt.Errorf("env file %s: larger than %d bytes", path, maxEnvFile)
	}
	return parseEnvFile(path, buf.Bytes())
}

// parseEnvFile parses the text of an env file named name.
func parseEnvFile(name string, data []byte) ([]envVar, error) {
	var out []envVar
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), maxEnvFile)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(strings.TrimSuffix(sc.Text(), "\r"))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		s = strings.TrimPrefix(s, "export ")
		k, v, ok := strings.Cut(s, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s:%d: want NAME=VALUE", name, line))
			continue
		case !decide.ValidEnvName(k):
			errs = append(errs, fmt.Errorf("%s:%d: %q is not an environment variable name", name, line, clipArg(k)))
			continue
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		} else if len(v) > 0 && (v[0] == '"' || v[0] == '\'') {
			errs = append(errs, fmt.Errorf("%s:%d: %s: unterminated quote", name, line, k))
			continue
		}
		if strings.IndexByte(v, 0) >= 0 {
			errs = append(errs, fmt.Errorf("%s:%d: %s: the value holds a NUL byte", name, line, k))
			continue
		}
		out = append(out, envVar{Name: k, Value: strings.Clone(v)})
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s:%d: %w", name, line+1, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// scrubArgs overwrites the value of every inline --env NAME=VALUE[@host]
// in the process's own argument vector (os.Args), so that
// /proc/PID/cmdline no longer shows it: on Linux the strings of os.Args
// share the memory of the argument area the kernel reads it from. Only
// the VALUE part of an --env argument is touched (between its first '='
// and its last '@', as parseEnvArg reads it): every other argument, and
// the name and binding of an --env, are strings other flags and the
// agent's argv still use. The values were copied when the flags were
// parsed. The value remains in the invoking shell's history: prefer
// --env NAME or --env-file.
func scrubArgs(args []string) {
	for k := 0; k < len(args); k++ {
		a := args[k]
		if a == "--" {
			return // the agent's own argv
		}
		var v string
		switch {
		case a == "--env" || a == "-env":
			if k+1 < len(args) {
				k++
				v = args[k]
			}
		case strings.HasPrefix(a, "--env="):
			v = a[len("--env="):]
		case strings.HasPrefix(a, "-env="):
			v = a[len("-env="):]
		default:
			continue
		}
		scrubValue(v)
	}
}

// scrubValue overwrites, in place, the VALUE of NAME=VALUE[@host].
func scrubValue(arg string) {
	i := strings.IndexByte(arg, '=')
	if i < 0 {
		return // NAME or NAME@host: no value on the command line
	}
	end := len(arg)
	if at := strings.LastIndexByte(arg, '@'); at > i {
		end = at
	}
	if end <= i+1 {
		return
	}
	b := unsafe.Slice(unsafe.StringData(arg), len(arg))
	for j := i + 1; j < end; j++ {
		b[j] = '*'
	}
}
