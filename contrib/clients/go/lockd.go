// Package lockd is a client of lockd's line protocol (proto.md), with the standard library
// only: locks with leases and fencing tokens, renewals, STATUS and WATCH read into types,
// failover across a cluster's front-ends, TLS and AUTH, and WithLock, which runs a function
// under the lock, renews in the background and cancels the function's context the moment
// the lease can no longer be trusted. A LOCK takes several names at once as one set (And),
// all or none, and LockTokens gives each name's token.
//
// Every ERR reply is an *Error carrying its code: errors.Is(err, lockd.ErrTimeout) tells a
// wait that ran out from ErrNotHeld (the lease is gone) or ErrUnavailable (a cluster
// front-end that could not reach etcd) without parsing text.
package lockd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultAddr is the address used when neither Options.Addrs nor $LOCKD_ADDR gives one.
const DefaultAddr = "127.0.0.1:5001"

// maxReply bounds a reply line: the server's are far shorter.
const maxReply = 64 * 1024

// Error is an ERR reply: Code is the protocol's word (TIMEOUT, NOTHELD, ...), Message the rest.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "ERR " + e.Code
	}
	return "ERR " + e.Code + " " + e.Message
}

// Is makes errors.Is(err, ErrTimeout) match any ERR TIMEOUT, whatever its message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// The ERR codes of proto.md, for errors.Is.
var (
	ErrSyntax      = &Error{Code: "SYNTAX"}
	ErrUnknown     = &Error{Code: "UNKNOWN"}
	ErrBadArg      = &Error{Code: "BADARG"}
	ErrEncoding    = &Error{Code: "ENCODING"}
	ErrTooLong     = &Error{Code: "TOOLONG"}
	ErrTimeout     = &Error{Code: "TIMEOUT"}
	ErrNotHeld     = &Error{Code: "NOTHELD"}
	ErrConflict    = &Error{Code: "CONFLICT"}
	ErrReplaced    = &Error{Code: "REPLACED"}
	ErrLimit       = &Error{Code: "LIMIT"}
	ErrLagged      = &Error{Code: "LAGGED"}
	ErrShutdown    = &Error{Code: "SHUTDOWN"}
	ErrNoAuth      = &Error{Code: "NOAUTH"}
	ErrDenied      = &Error{Code: "DENIED"}
	ErrUnavailable = &Error{Code: "UNAVAILABLE"}
	ErrSuperseded  = &Error{Code: "SUPERSEDED"}
	ErrTLS         = &Error{Code: "TLS"}
)

// ErrConnection wraps every failure to reach lockd or to get a reply from it.
var ErrConnection = errors.New("lockd: connection failed")

// ErrLeaseLost is what WithLock returns (wrapped, with the reason) when the lease ended while
// the function ran.
var ErrLeaseLost = errors.New("lockd: lease lost")

// connError is a failure to reach lockd or to read its reply; final when trying again (or
// elsewhere) would fail the same way: a TLS handshake the configuration makes fail.
type connError struct {
	err   error
	final bool
}

func (e *connError) Error() string        { return "lockd: connection failed: " + e.err.Error() }
func (e *connError) Is(target error) bool { return target == ErrConnection }
func (e *connError) Unwrap() error        { return e.err }

// Options say how to reach lockd. The zero value reads lockctl's variables: $LOCKD_ADDR,
// $LOCKD_TLS_CA, $LOCKD_CLIENT_CERT, $LOCKD_CLIENT_KEY, $LOCKD_USER with $LOCKD_SECRET or
// $LOCKD_SECRET_FILE.
type Options struct {
	// Addrs: one lockd, or the front-ends of one lockd cluster, tried in turn.
	Addrs []string
	// ID is the id every LOCK of the Client is sent with. Without one, each LOCK takes a new
	// id, <hostname>:<pid>:<n> (n counting in this process), kept across its own resends:
	// the same id is the same client to lockd (a LOCK again is a retry, answered with the
	// same grant), so two holders in one process (goroutines, Clients) never share one.
	ID string
	// Timeout bounds each connection attempt and each reply that should come at once
	// (default 10s). A waiting LOCK waits its wait on top of it.
	Timeout time.Duration
	// TLS: a CA file to trust (the system's without one), and a client certificate and key
	// for mutual TLS. TLSConfig, if set, is used as it is. UseTLS with neither: the system's CAs.
	CAFile, CertFile, KeyFile string
	TLSConfig                 *tls.Config
	UseTLS                    bool
	// User logs every connection in (AUTH), with Secret, or the first line of SecretFile.
	User, Secret, SecretFile string
}

// Client is a connection to lockd, opened on first use and again after a failure, safe for
// use by several goroutines (one request at a time: a waiting LOCK holds it, so give a
// goroutine that waits its own Client, or use Clone).
type Client struct {
	addrs   []string
	id      string
	timeout time.Duration
	tls     *tls.Config
	user    string
	secret  string

	mu    sync.Mutex
	conn  net.Conn
	r     *bufio.Reader
	at    int // the address of the current (or latest) connection
	start int // where the next connection starts
}

// New checks the options (a file that can't be read, a user without a secret) and returns a
// Client; it connects on first use.
func New(o Options) (*Client, error) {
	c := &Client{id: o.ID, timeout: o.Timeout, user: o.User, secret: o.Secret}
	addrs := o.Addrs
	if len(addrs) == 0 {
		if env := os.Getenv("LOCKD_ADDR"); env != "" {
			addrs = strings.Split(env, ",")
		} else {
			addrs = []string{DefaultAddr}
		}
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil || strings.TrimSpace(a) != a {
			return nil, fmt.Errorf("lockd: address must be host:port, not %q", a)
		}
	}
	c.addrs = addrs
	if c.id != "" {
		if err := word("id", c.id); err != nil {
			return nil, err
		}
	}
	if c.timeout <= 0 {
		c.timeout = 10 * time.Second
	}
	var err error
	if c.tls, err = tlsConfig(o); err != nil {
		return nil, err
	}
	if err = c.credentials(o); err != nil {
		return nil, err
	}
	return c, nil
}

// nextID counts the LOCKs of this process that took a default id.
var nextID atomic.Uint64

// DefaultID is a new holder's id: <hostname>:<pid>:<n>, n counting in this process.
func DefaultID() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s:%d:%d", host, os.Getpid(), nextID.Add(1))
}

// Clone is a Client with the same options and a connection of its own.
func (c *Client) Clone() *Client {
	return &Client{addrs: c.addrs, id: c.id, timeout: c.timeout, tls: c.tls, user: c.user, secret: c.secret}
}

// ID is the id this client locks with; "" when each LOCK takes a new one (see Options.ID).
func (c *Client) ID() string { return c.id }

func tlsConfig(o Options) (*tls.Config, error) {
	if o.TLSConfig != nil {
		return o.TLSConfig, nil
	}
	ca, cert, key := o.CAFile, o.CertFile, o.KeyFile
	if ca == "" && cert == "" && !o.UseTLS {
		ca, cert, key = os.Getenv("LOCKD_TLS_CA"), os.Getenv("LOCKD_CLIENT_CERT"), os.Getenv("LOCKD_CLIENT_KEY")
		if ca == "" && cert == "" {
			return nil, nil
		}
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("lockd: cannot read the CA file: %w", err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("lockd: no certificate in the CA file %s", ca)
		}
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("lockd: cannot load the client certificate: %w", err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf, nil
}

func (c *Client) credentials(o Options) error {
	if c.user == "" {
		c.user = os.Getenv("LOCKD_USER")
	}
	file := o.SecretFile
	if c.secret == "" && file == "" {
		c.secret, file = os.Getenv("LOCKD_SECRET"), os.Getenv("LOCKD_SECRET_FILE")
	}
	if c.secret != "" && file != "" {
		return errors.New("lockd: the secret is given twice: give it one way")
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("lockd: cannot read the secret file: %w", err)
		}
		c.secret = strings.TrimRight(strings.SplitN(string(data), "\n", 2)[0], "\r")
	}
	switch {
	case c.user == "" && c.secret == "":
		return nil
	case c.user == "":
		return errors.New("lockd: a secret without a user")
	case c.secret == "":
		return fmt.Errorf("lockd: user %s needs a secret", c.user)
	}
	if err := word("user", c.user); err != nil {
		return err
	}
	return word("secret", c.secret)
}

// word checks a name, id or secret is one protocol word, so it can neither split a request
// nor add one.
func word(what, v string) error {
	if v == "" || len(v) > 255 || strings.IndexFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return fmt.Errorf("lockd: %s must be 1 to 255 bytes without whitespace or control characters: %q", what, v)
	}
	return nil
}

// Close closes the connection (ending its session leases); the next request reconnects.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(false)
	return nil
}

// drop closes the connection; after a failure the next one starts at the next address.
func (c *Client) drop(failed bool) {
	if c.conn != nil {
		c.conn.Close()
		if failed {
			c.start = c.at + 1
		}
	}
	c.conn, c.r = nil, nil
}

// dial connects to the addresses in turn from c.start, then logs in.
func (c *Client) dial(ctx context.Context) error {
	var failed []string
	for k := range c.addrs {
		i := (c.start + k) % len(c.addrs)
		addr := c.addrs[i]
		d := net.Dialer{Timeout: c.timeout}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil && c.tls != nil {
			conf := c.tls.Clone()
			if conf.ServerName == "" {
				conf.ServerName, _, _ = net.SplitHostPort(addr)
			}
			tc := tls.Client(conn, conf)
			tc.SetDeadline(time.Now().Add(c.timeout))
			if err = tc.HandshakeContext(ctx); err != nil {
				tc.Close()
				// A TLS failure is the configuration's: every front-end would refuse it alike.
				return &connError{fmt.Errorf("TLS with lockd at %s failed: %w", addr, err), true}
			}
			conn = tc
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", addr, err))
			continue
		}
		c.conn, c.r, c.at, c.start = conn, bufio.NewReaderSize(conn, 4096), i, i
		if c.user == "" {
			return nil
		}
		reply, err := c.exchange(ctx, "AUTH "+c.user+" "+c.secret, c.timeout)
		if err != nil {
			c.drop(true)
			return err
		}
		switch {
		case strings.HasPrefix(reply, "OK"),
			strings.HasPrefix(reply, "ERR DENIED authentication is off"),
			strings.HasPrefix(reply, "ERR DENIED already authenticated as "+c.user+";"):
			return nil
		}
		c.drop(false)
		if e := parseErr(reply); e != nil {
			return &Error{Code: e.Code, Message: fmt.Sprintf("lockd at %s refused to log in user %s: %s", addr, c.user, e.Message)}
		}
		return &connError{err: fmt.Errorf("unexpected reply to AUTH: %q", reply)}
	}
	return &connError{err: fmt.Errorf("cannot connect to lockd at %s", strings.Join(failed, "; nor at "))}
}

// exchange sends one line and reads one reply line, within limit (none if 0) and ctx.
func (c *Client) exchange(ctx context.Context, line string, limit time.Duration) (string, error) {
	if err := c.send(ctx, line); err != nil {
		return "", err
	}
	return c.readLine(ctx, limit)
}

func (c *Client) send(ctx context.Context, line string) error {
	c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		c.drop(true)
		return &connError{err: err}
	}
	return nil
}

// readLine reads one reply line; a cancelled ctx ends the wait by closing the connection.
func (c *Client) readLine(ctx context.Context, limit time.Duration) (string, error) {
	deadline := time.Time{}
	if limit > 0 {
		deadline = time.Now().Add(limit)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	conn := c.conn
	conn.SetReadDeadline(deadline)
	// A cancelled ctx ends the read at once. The watcher is waited for, so that it can't
	// cut a later read short.
	done, exited := make(chan struct{}), make(chan struct{})
	defer func() { close(done); <-exited }()
	go func() {
		defer close(exited)
		select {
		case <-ctx.Done():
			conn.SetReadDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	raw, err := c.r.ReadSlice('\n')
	if err != nil {
		c.drop(true)
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			return "", &connError{err: errors.New("over-long reply line")}
		}
		return "", &connError{err: err}
	}
	return strings.TrimRight(string(raw), "\r\n"), nil
}

// request sends line on the connection (made if needed) and returns the text after OK, or the
// ERR as an *Error. read, if given, reads the rest of a many-line answer.
func (c *Client) request(ctx context.Context, line string, limit time.Duration, read func(first string) (string, error)) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		if err := c.dial(ctx); err != nil {
			return "", err
		}
	}
	reply, err := c.exchange(ctx, line, limit)
	if err == nil && read != nil {
		reply, err = read(reply)
	}
	if err != nil {
		return "", err
	}
	if reply == "OK" || strings.HasPrefix(reply, "OK ") {
		return strings.TrimPrefix(strings.TrimPrefix(reply, "OK"), " "), nil
	}
	if e := parseErr(reply); e != nil {
		if e.Code == "TOOLONG" || e.Code == "LAGGED" || e.Code == "SHUTDOWN" || e.Code == "TLS" {
			c.drop(true) // the server closes the connection after these
		}
		return "", e
	}
	c.drop(true)
	return "", &connError{err: fmt.Errorf("unexpected reply %q", reply)}
}

func parseErr(reply string) *Error {
	if !strings.HasPrefix(reply, "ERR ") {
		return nil
	}
	code, msg, _ := strings.Cut(reply[4:], " ")
	return &Error{Code: code, Message: msg}
}

// retryable: the same request may succeed through another front-end, or later.
func retryable(err error) bool {
	var ce *connError
	if errors.As(err, &ce) {
		return !ce.final
	}
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrShutdown)
}
