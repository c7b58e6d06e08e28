// Command httpsclient is the Go net/http client the interception tests
// run inside the sandbox. It trusts what the sandbox gives it (Go reads
// SSL_CERT_FILE and the system bundle) and prints one line per request:
// the status and the start of the body, or "error" and why.
//
//	httpsclient req METHOD URL [BODY [HEADER-VALUE]]
//	httpsclient ka h1|h2 URL...   (one connection; each line adds "reused")
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: httpsclient req METHOD URL [BODY [HEADER]] | ka h1|h2 URL...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "req":
		var body, hdr string
		if len(os.Args) > 4 {
			body = os.Args[4]
		}
		if len(os.Args) > 5 {
			hdr = os.Args[5]
		}
		fmt.Println(do(http.DefaultClient, os.Args[2], os.Args[3], body, hdr))
	case "ka":
		tr := &http.Transport{ForceAttemptHTTP2: true}
		if os.Args[2] == "h1" {
			tr = &http.Transport{TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
		}
		c := &http.Client{Transport: tr, Timeout: 20 * time.Second}
		for _, u := range os.Args[3:] {
			fmt.Println(do(c, "GET", u, "", ""))
		}
	}
}

func do(c *http.Client, method, url, body, hdr string) string {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	reused := false
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return "error " + err.Error()
	}
	if hdr != "" {
		req.Header.Set("X-Data", hdr)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "error " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body) // whole, so the connection can be reused
	if len(b) > 300 {
		b = b[:300]
	}
	return fmt.Sprintf("%d %s reused=%v %s", resp.StatusCode, resp.Proto, reused, strings.ReplaceAll(string(b), "\n", " "))
}
