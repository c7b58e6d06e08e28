package chv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
)

// Errors of the REST API, from the status codes its OpenAPI document
// gives each endpoint.
var (
	// ErrNotCreated is a 404: the VM is not created (or, for resume, not
	// booted).
	ErrNotCreated = errors.New("chv: vm not created")
	// ErrWrongState is a 405: the VM is not in a state the action
	// applies to (pause a VM that is not booted, resume one that is not
	// paused, shut down one that is not started).
	ErrWrongState = errors.New("chv: vm not in a state for this action")
	// ErrAPI is any other unexpected status.
	ErrAPI = errors.New("chv: api error")
)

// APIPrefix is the path prefix of every endpoint (the OpenAPI document's
// server URL http://localhost/api/v1).
const APIPrefix = "/api/v1/"

// VMState is the VM's state (the VmState schema).
type VMState string

// The states.
const (
	StateCreated    VMState = "Created"
	StateRunning    VMState = "Running"
	StateShutdown   VMState = "Shutdown"
	StatePaused     VMState = "Paused"
	StateBreakPoint VMState = "BreakPoint"
)

// PingResponse is the VmmPingResponse schema.
type PingResponse struct {
	BuildVersion string   `json:"build_version,omitempty"`
	Version      string   `json:"version"`
	PID          int64    `json:"pid,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// VMInfo is the VmInfo schema. Config (VmConfig) is kept as JSON: carbd
// reads only the state and the memory size.
type VMInfo struct {
	Config           json.RawMessage       `json:"config"`
	State            VMState               `json:"state"`
	MemoryActualSize int64                 `json:"memory_actual_size,omitempty"`
	DeviceTree       map[string]DeviceNode `json:"device_tree,omitempty"`
}

// DeviceNode is the DeviceNode schema.
type DeviceNode struct {
	ID        string            `json:"id,omitempty"`
	Resources []json.RawMessage `json:"resources,omitempty"`
	Children  []string          `json:"children,omitempty"`
	PCIBDF    string            `json:"pci_bdf,omitempty"`
}

// Client calls Cloud Hypervisor's REST API over its Unix socket
// (HTTP/1.1). It is safe for concurrent use.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the API socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableCompression: true,
		MaxIdleConns:       1,
	}
	return &Client{socket: path, hc: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// do sends one request and returns the status and body.
func (c *Client) do(ctx context.Context, method, endpoint string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+APIPrefix+endpoint, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("chv: %s %s: %w", method, endpoint, err)
	}
	if method == http.MethodGet {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("chv: %s %s: %w", method, endpoint, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("chv: %s %s: read body: %w", method, endpoint, err)
	}
	return resp.StatusCode, body, nil
}

func statusError(endpoint string, status int, body []byte) error {
	msg := strings.TrimSpace(string(bytes.ToValidUTF8(body, []byte("?"))))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	var base error
	switch status {
	case http.StatusNotFound:
		base = ErrNotCreated
	case http.StatusMethodNotAllowed:
		base = ErrWrongState
	default:
		base = ErrAPI
	}
	if msg == "" {
		return fmt.Errorf("%w: %s: status %d", base, endpoint, status)
	}
	return fmt.Errorf("%w: %s: status %d: %s", base, endpoint, status, msg)
}

// action PUTs an endpoint that takes no body and answers 204.
func (c *Client) action(ctx context.Context, endpoint string) error {
	status, body, err := c.do(ctx, http.MethodPut, endpoint)
	if err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return statusError(endpoint, status, body)
	}
	return nil
}

// getJSON GETs an endpoint that answers 200 with JSON into v.
func (c *Client) getJSON(ctx context.Context, endpoint string, v any) error {
	status, body, err := c.do(ctx, http.MethodGet, endpoint)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return statusError(endpoint, status, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %s: response: %v", ErrAPI, endpoint, err)
	}
	return nil
}

// Ping is GET /vmm.ping: the VMM's version (200).
func (c *Client) Ping(ctx context.Context) (*PingResponse, error) {
	var p PingResponse
	if err := c.getJSON(ctx, "vmm.ping", &p); err != nil {
		return nil, err
	}
	if p.Version == "" {
		return nil, fmt.Errorf("%w: vmm.ping: response without version", ErrAPI)
	}
	return &p, nil
}

// Info is GET /vm.info (200; 404 when the VM is not created).
func (c *Client) Info(ctx context.Context) (*VMInfo, error) {
	var v VMInfo
	if err := c.getJSON(ctx, "vm.info", &v); err != nil {
		return nil, err
	}
	if v.State == "" || len(v.Config) == 0 {
		return nil, fmt.Errorf("%w: vm.info: response without state or config", ErrAPI)
	}
	return &v, nil
}

// Pause is PUT /vm.pause (204; 404 not created; 405 not booted).
func (c *Client) Pause(ctx context.Context) error { return c.action(ctx, "vm.pause") }

// Resume is PUT /vm.resume (204; 404 not booted; 405 not paused).
func (c *Client) Resume(ctx context.Context) error { return c.action(ctx, "vm.resume") }

// Shutdown is PUT /vm.shutdown: the VM stops at once, as a power cut (204;
// 404 not created; 405 not started).
func (c *Client) Shutdown(ctx context.Context) error { return c.action(ctx, "vm.shutdown") }

// PowerButton is PUT /vm.power-button: an ACPI power button press the
// guest may act on (204; 404; 405).
func (c *Client) PowerButton(ctx context.Context) error { return c.action(ctx, "vm.power-button") }

// ShutdownVMM is PUT /vmm.shutdown: the cloud-hypervisor process exits
// (204).
func (c *Client) ShutdownVMM(ctx context.Context) error { return c.action(ctx, "vmm.shutdown") }
