package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"
)

// Reply is a decoded reply line of any op, for clients. Fields an op does not
// send stay zero.
type Reply struct {
	ID           json.RawMessage `json:"id,omitempty"`
	OK           bool            `json:"ok"`
	Allowed      bool            `json:"allowed"`
	Replay       bool            `json:"replay"`
	Limit        int64           `json:"limit"`
	Used         int64           `json:"used"`
	Remaining    int64           `json:"remaining"`
	ResetMS      int64           `json:"reset_ms"`
	RetryAfterMS int64           `json:"retry_after_ms"`
	Store        string          `json:"store"`
	RedisOK      bool            `json:"redis_ok"`
	Version      string          `json:"version"`
	Error        Code            `json:"error"`
	Message      string          `json:"message"`
}

// Err returns the reply's error as an *Error, or nil for an ok reply.
func (r *Reply) Err() error {
	if r.OK {
		return nil
	}
	return &Error{Code: r.Error, Message: r.Message}
}

// Client is a connection to a quotad socket that sends one request at a time.
// It is safe for concurrent use; calls are serialised. Pipelining clients
// write many lines before reading (see PROTOCOL.md); this one does not need to.
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	lr   *LineReader
}

// Dial connects to the sidecar's Unix socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to quotad: %w", err)
	}
	return &Client{conn: conn, lr: NewLineReader(conn, 4096, 1<<20)}, nil
}

// Do sends one request line (without its newline) and returns the reply line
// (without its newline). The slice is the caller's.
func (c *Client) Do(ctx context.Context, line []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Time{}
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("set deadline: %w", err)
	}
	msg := make([]byte, 0, len(line)+1)
	msg = append(append(msg, line...), '\n')
	if _, err := c.conn.Write(msg); err != nil {
		return nil, fmt.Errorf("write request: %w", err)
	}
	reply, err := c.lr.ReadLine()
	if err != nil {
		return nil, fmt.Errorf("read reply: %w", err)
	}
	return append([]byte(nil), reply...), nil
}

// Call marshals req (any JSON-encodable value, such as a map) and returns the
// decoded reply and its raw line. An error reply is a Reply with OK false,
// not an error: err is for transport and decoding failures.
func (c *Client) Call(ctx context.Context, req any) (Reply, []byte, error) {
	line, err := json.Marshal(req)
	if err != nil {
		return Reply{}, nil, fmt.Errorf("encode request: %w", err)
	}
	raw, err := c.Do(ctx, line)
	if err != nil {
		return Reply{}, nil, err
	}
	var r Reply
	if err := json.Unmarshal(raw, &r); err != nil {
		return Reply{}, raw, fmt.Errorf("decode reply %q: %w", raw, err)
	}
	return r, raw, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }
