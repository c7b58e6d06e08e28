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

// Errors of the REST API. Cloud Hypervisor's handlers answer with fewer
// codes than its OpenAPI document lists (vmm/src/api/http/mod.rs,
// api_error_status_code and EndpointHandler::handle_request): a request
// the VMM refuses is a 500 whose body names the reason, "VM is not
// created" is a 404 only from v53 (a 500 before), and no handler ever
// answers 405. The client classifies by code and body.
var (
	// ErrNotCreated: no VM is created (404 from v53; a 500 naming "VM is
	// not created" before).
	ErrNotCreated = errors.New("chv: vm not created")
	// ErrWrongState: the VM is not in a state the action applies to: a
	// 500 whose body names it ("VM is not running" for vm.shutdown,
	// vm.pause, vm.resume and vm.power-button once the VM is shut down;
	// "InvalidStateTransition" for pausing a paused VM or resuming a
	// running one).
	ErrWrongState = errors.New("chv: vm not in a state for this action")
	// ErrAPI is any other unexpected status or response.
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
		// Not required by Cloud Hypervisor; it always answers JSON.
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

// wrongStateMarks and notCreatedMarks are what the error bodies of the
// releases say (VmError's messages in vmm/src/vm.rs and vmm/src/lib.rs:
// "VM is not running", "VM is not booted" before v41, the
// InvalidStateTransition of a state change vm.rs refuses, and "VM is not
// created"), lowercased.
var (
	wrongStateMarks = []string{"vm is not running", "vm is not booted", "invalidstatetransition", "invalid vm state transition"}
	notCreatedMarks = []string{"vm is not created"}
)

func statusError(endpoint string, status int, body []byte) error {
	msg := errorMessage(body)
	var base error
	switch status {
	case http.StatusNotFound:
		base = ErrNotCreated
	case http.StatusInternalServerError:
		base = ErrAPI
		low := strings.ToLower(msg)
		for _, m := range wrongStateMarks {
			if strings.Contains(low, m) {
				base = ErrWrongState
			}
		}
		for _, m := range notCreatedMarks {
			if strings.Contains(low, m) {
				base = ErrNotCreated
			}
		}
	default:
		base = ErrAPI
	}
	if msg == "" {
		return fmt.Errorf("%w: %s: status %d", base, endpoint, status)
	}
	return fmt.Errorf("%w: %s: status %d: %s", base, endpoint, status, msg)
}

// errorMessage is an error body as one line: v48 and later send a JSON
// array of the error chain's messages (error_response in
// vmm/src/api/http/mod.rs), which is joined with ": "; earlier releases
// send the message as text.
func errorMessage(body []byte) string {
	body = bytes.TrimSpace(body)
	var chain []string
	if json.Unmarshal(body, &chain) == nil && len(chain) > 0 {
		body = []byte(strings.Join(chain, ": "))
	}
	msg := strings.TrimSpace(string(bytes.ToValidUTF8(body, []byte("?"))))
	if len(msg) > 300 {
		msg = msg[:300] + "..."
	}
	return msg
}

// action PUTs an endpoint that takes no body. Success is 204 for the vm.*
// actions and 200 for vmm.shutdown (VmmShutdown::handle_request in
// vmm/src/api/http/http_endpoint.rs answers 200 in every release, where
// the OpenAPI document says 204); either is accepted for each.
func (c *Client) action(ctx context.Context, endpoint string) error {
	status, body, err := c.do(ctx, http.MethodPut, endpoint)
	if err != nil {
		return err
	}
	if status != http.StatusNoContent && status != http.StatusOK {
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

// Info is GET /vm.info (200; ErrNotCreated when no VM is created). After
// vm.shutdown the state is Created: the VMM drops the VM and keeps its
// config (Vmm::vm_info in vmm/src/lib.rs), so Shutdown is never seen
// through the API.
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

// Pause is PUT /vm.pause (204; ErrWrongState when the VM is not running
// or already paused).
func (c *Client) Pause(ctx context.Context) error { return c.action(ctx, "vm.pause") }

// Resume is PUT /vm.resume (204; ErrWrongState when the VM is not
// paused).
func (c *Client) Resume(ctx context.Context) error { return c.action(ctx, "vm.resume") }

// Shutdown is PUT /vm.shutdown: the VM stops at once, as a power cut
// (204; ErrWrongState when no VM is running, e.g. already shut down). The
// VMM process stays up.
func (c *Client) Shutdown(ctx context.Context) error { return c.action(ctx, "vm.shutdown") }

// PowerButton is PUT /vm.power-button: an ACPI power button press the
// guest may act on (204; ErrWrongState when no VM is running).
func (c *Client) PowerButton(ctx context.Context) error { return c.action(ctx, "vm.power-button") }

// ShutdownVMM is PUT /vmm.shutdown: the VM is shut down and deleted and
// the cloud-hypervisor process exits (200 in the code, 204 in the
// OpenAPI document: both are accepted).
func (c *Client) ShutdownVMM(ctx context.Context) error { return c.action(ctx, "vmm.shutdown") }
