package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
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

	// Added to the protocol after its first version; see PROTOCOL.md.
	Degraded      bool   `json:"degraded"`
	RedisError    string `json:"redis_error,omitempty"`
	LeaseMS       int64  `json:"lease_ms"`
	Released      bool   `json:"released"`
	Settled       bool   `json:"settled"`
	Reserved      int64  `json:"reserved"`
	Shadow        bool   `json:"shadow"`
	ShadowAllowed bool   `json:"shadow_allowed"`
	Ready         bool   `json:"ready"`
	Local         bool   `json:"local"`
	// Headers: the RateLimit header fields of a take or peek that asked
	// for them, by field name; nil otherwise.
	Headers map[string]string `json:"headers,omitempty"`
	// Checks: the answer of each check of a take of several limits, in
	// order (checks.go); Skipped is set on a check that was not asked.
	Checks  []Reply `json:"checks,omitempty"`
	Skipped bool    `json:"skipped"`
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
//
// Replies are matched to requests by order alone, so once a call fails after
// it may have sent something (a timeout, a cancellation, an I/O error, a
// reply too long to read), the reply it did not read could be handed to the
// next call. The client closes its connection then, and every later call
// fails with an error matching net.ErrClosed: dial again to carry on.
type Client struct {
	mu     sync.Mutex
	conn   net.Conn
	lr     *LineReader
	broken bool // a call failed mid-exchange; the connection is closed
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

// errNewline refuses a line that the sidecar would read as two requests,
// answering both and shifting every later reply onto the wrong call.
var errNewline = errors.New("send request: line contains a newline")

// Do sends one request line (without its newline) and returns the reply line
// (without its newline). The slice is the caller's. The context's deadline
// and cancellation bound the whole exchange; an error caused by them matches
// ctx.Err().
func (c *Client) Do(ctx context.Context, line []byte) ([]byte, error) {
	if bytes.IndexByte(line, '\n') >= 0 {
		return nil, errNewline
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken {
		return nil, fmt.Errorf("send request: %w: an earlier call failed, so replies can no longer be matched", net.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("send request: %w", err) // nothing sent; the client stays usable
	}
	deadline, _ := ctx.Deadline() // zero, and so no deadline, when ctx has none
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, c.fail(ctx, "set deadline", err)
	}
	// A deadline in the past wakes a blocked read or write on cancellation.
	// stop waits for a cancellation already under way, so that it cannot
	// reach into the next call.
	woken := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.conn.SetDeadline(time.Unix(1, 0))
		close(woken)
	})
	defer func() {
		if !stop() {
			<-woken
		}
	}()
	msg := make([]byte, 0, len(line)+1)
	msg = append(append(msg, line...), '\n')
	if _, err := c.conn.Write(msg); err != nil {
		return nil, c.fail(ctx, "write request", err)
	}
	reply, err := c.lr.ReadLine()
	if err != nil {
		return nil, c.fail(ctx, "read reply", err)
	}
	return append([]byte(nil), reply...), nil
}

// fail closes the connection after a failed exchange and returns err
// wrapped with op, and with ctx's error when ctx ended the exchange.
func (c *Client) fail(ctx context.Context, op string, err error) error {
	c.broken = true
	c.conn.Close()
	cerr := ctx.Err()
	if cerr == nil && errors.Is(err, os.ErrDeadlineExceeded) {
		// The connection's only deadline is ctx's, and the poller can see
		// it pass before ctx's own timer fires.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		return fmt.Errorf("%s: %w: %w", op, cerr, err)
	}
	return fmt.Errorf("%s: %w", op, err)
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
