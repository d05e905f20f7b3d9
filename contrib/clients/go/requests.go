package lockd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// LockOption is one option of LOCK (proto.md): TTL, Wait, Session, Detach, Plain, Shared,
// Limit, Supersede, Note, And.
type LockOption func(*lockOpts)

type lockOpts struct {
	ttl, wait, grace time.Duration
	hasWait          bool
	tie              string // "detach" (the default), "session", "plain"
	shared           bool
	limit            int
	supersede        bool
	note             string
	and              []string
}

// TTL is the lease (default: the server's --default-ttl, 30s).
func TTL(d time.Duration) LockOption { return func(o *lockOpts) { o.ttl = d } }

// Wait bounds the wait in the queue: then ErrTimeout. Wait(0) tries once. Without it, a LOCK
// waits as long as it takes (or until its context ends).
func Wait(d time.Duration) LockOption { return func(o *lockOpts) { o.wait, o.hasWait = d, true } }

// Session ties the lease to the connection: it ends grace after the connection closes,
// unless renewed (from any connection) first. Session(0): at once.
func Session(grace time.Duration) LockOption {
	return func(o *lockOpts) { o.tie, o.grace = "session", grace }
}

// Detach ties only the wait to the connection (the default of this client): a process that
// dies while it waits leaves the queue, and the lease, once granted, outlives the connection.
func Detach() LockOption { return func(o *lockOpts) { o.tie = "detach" } }

// Plain sends neither session nor detach (for a lockd older than detach).
func Plain() LockOption { return func(o *lockOpts) { o.tie = "plain" } }

// Shared holds the lock beside other shared holders, never beside an exclusive one.
func Shared() LockOption { return func(o *lockOpts) { o.shared = true } }

// Limit takes one of n slots of a semaphore.
func Limit(n int) LockOption { return func(o *lockOpts) { o.limit = n } }

// Supersede makes a LOCK that must wait take the whole queue: every request waiting on the
// name gets ErrSuperseded, and this one waits first in line (newest wins).
func Supersede() LockOption { return func(o *lockOpts) { o.supersede = true } }

// Note is a short text for people ("release 1.4.2 by ci job 8812"), shown with the holder by
// STATUS and WATCH: printable, at most the server's --max-note bytes. "" sends none.
func Note(text string) LockOption { return func(o *lockOpts) { o.note = text } }

// And adds further names of a set (proto.md, "Several names at once"), taken with the LOCK's
// own name all at once or not at all, as one lease: every other option applies to each name,
// and a Renew, Check or Unlock of any one of them, with the token given for it, applies to the
// whole set. A refusal of any name refuses the set, and nothing changes. LockTokens returns a
// token per name (Lock the first name's). Not with Supersede. Given more than once, the names
// add up, in order.
func And(names ...string) LockOption {
	return func(o *lockOpts) { o.and = append(o.and, names...) }
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }

// Lock takes the lock name and returns its fencing token, waiting in the FIFO queue while it
// is held. A LOCK whose connection is lost, or that is answered ERR UNAVAILABLE or SHUTDOWN,
// is sent again (same id) through the next address, for the rest of its wait: a cluster gives
// it back its place, or the grant made meanwhile. Cancelling ctx ends the wait (the
// connection is closed, so the server drops the waiter). With And, the token is the first
// name's (name's): LockTokens gives every name's.
func (c *Client) Lock(ctx context.Context, name string, options ...LockOption) (uint64, error) {
	tokens, err := c.LockTokens(ctx, name, options...)
	if err != nil {
		return 0, err
	}
	return tokens[0], nil
}

// LockTokens is Lock, returning every name's token: name's first, then those of And in their
// order (one for a LOCK of one name). Fence a write to each resource with the token given for
// its name, and assume nothing about how they compare (today they are one number).
func (c *Client) LockTokens(ctx context.Context, name string, options ...LockOption) ([]uint64, error) {
	o := lockOpts{tie: "detach"}
	for _, opt := range options {
		opt(&o)
	}
	if err := word("name", name); err != nil {
		return nil, err
	}
	for _, n := range o.and {
		if err := word("name", n); err != nil {
			return nil, err
		}
	}
	if o.shared && o.limit != 0 {
		return nil, errors.New("lockd: Shared and Limit exclude each other")
	}
	if o.supersede && len(o.and) > 0 {
		return nil, errors.New("lockd: Supersede takes one name, not a set (And)")
	}
	for _, r := range o.note {
		if r < 0x20 || r == 0x7f {
			return nil, errors.New("lockd: a note is printable text (no control characters)")
		}
	}
	id := c.id
	if id == "" {
		id = DefaultID()
	}
	head := "LOCK " + name + " " + id
	if o.ttl != 0 {
		head += " ttl=" + ms(o.ttl)
	}
	tail := ""
	switch o.tie {
	case "detach":
		tail += " detach"
	case "session":
		tail += " session=" + ms(o.grace)
	}
	if o.shared {
		tail += " shared"
	} else if o.limit != 0 {
		tail += " limit=" + strconv.Itoa(o.limit)
	}
	if o.supersede {
		tail += " supersede"
	}
	for _, n := range o.and {
		tail += " and=" + n
	}
	if note := strings.TrimSpace(o.note); note != "" {
		tail += " note=" + note // last: it takes the rest of the line
	}
	until := time.Now().Add(o.wait)
	for tries := 1; ; tries++ {
		line, limit := head, time.Duration(0)
		if o.hasWait {
			left := time.Until(until)
			if left < 0 {
				left = 0
			}
			line += " wait=" + ms(left)
			limit = left + c.timeout
		}
		rest, err := c.request(ctx, line+tail, limit, nil)
		if err == nil {
			// OK <token> [<token2> ...]: one per name, in the request's order.
			words := strings.Split(rest, " ")
			if len(words) != 1+len(o.and) {
				return nil, &connError{err: fmt.Errorf("unexpected reply to LOCK: %q", rest)}
			}
			tokens := make([]uint64, len(words))
			for i, w := range words {
				token, perr := strconv.ParseUint(w, 10, 64)
				if perr != nil {
					return nil, &connError{err: fmt.Errorf("unexpected reply to LOCK: %q", rest)}
				}
				tokens[i] = token
			}
			return tokens, nil
		}
		outOfTime := o.hasWait && !time.Now().Before(until)
		if !retryable(err) || ctx.Err() != nil || outOfTime || (len(c.addrs) < 2 && !o.hasWait) || tries > 4*len(c.addrs) {
			return nil, err
		}
		if !errors.Is(err, ErrConnection) {
			// This front-end can't serve it now (UNAVAILABLE, SHUTDOWN): the next one may.
			c.mu.Lock()
			c.drop(true)
			c.mu.Unlock()
		}
		select { // a pause, then the same LOCK through the next front-end
		case <-time.After(50 * time.Millisecond * time.Duration(tries)):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Unlock releases the lease; ErrNotHeld if token is not the live lease.
func (c *Client) Unlock(ctx context.Context, name string, token uint64) error {
	if err := word("name", name); err != nil {
		return err
	}
	_, err := c.request(ctx, fmt.Sprintf("UNLOCK %s %d", name, token), c.timeout, nil)
	return err
}

// Renew extends the lease to ttl from now (0: its own ttl) and returns the time it has left;
// ErrNotHeld if the lease is gone: the caller has lost the lock and must stop.
func (c *Client) Renew(ctx context.Context, name string, token uint64, ttl time.Duration) (time.Duration, error) {
	line := fmt.Sprintf("RENEW %s %d", name, token)
	if ttl != 0 {
		line += " ttl=" + ms(ttl)
	}
	return c.lease(ctx, name, line)
}

// Check returns the time the lease has left if token is the live lease, else ErrNotHeld.
func (c *Client) Check(ctx context.Context, name string, token uint64) (time.Duration, error) {
	return c.lease(ctx, name, fmt.Sprintf("CHECK %s %d", name, token))
}

func (c *Client) lease(ctx context.Context, name, line string) (time.Duration, error) {
	if err := word("name", name); err != nil {
		return 0, err
	}
	rest, err := c.request(ctx, line, c.timeout, nil)
	if err != nil {
		return 0, err
	}
	n, perr := strconv.ParseInt(strings.TrimPrefix(rest, "ttl_ms="), 10, 64)
	if perr != nil || !strings.HasPrefix(rest, "ttl_ms=") {
		return 0, &connError{err: fmt.Errorf("unexpected reply %q", rest)}
	}
	return time.Duration(n) * time.Millisecond, nil
}

// Ping asks for OK PONG.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.request(ctx, "PING", c.timeout, nil)
	return err
}

// Status is one lock as STATUS shows it: Free, or its first holder, the queue's length, how
// many hold it and its mode ("exclusive", "shared", "limit:<n>").
type Status struct {
	Name    string
	Free    bool
	ID      string
	Token   uint64
	TTL     time.Duration
	Session bool
	Waiters int
	Holders int
	Mode    string
	Note    string // the first holder's note; empty for none
}

// Holder is a HOLDER line of STATUS <name> detail.
type Holder struct {
	Name    string
	ID      string
	Token   uint64
	Held    time.Duration
	TTL     time.Duration
	Session bool
	Mode    string
	User    string // empty for a lease of no user
	Note    string // empty for none
	// And: the other names of the holder's set (its and= fields, in the order its LOCK gave
	// them: its one lease holds them too); nil for a lease of one name.
	And []string
}

// Waiter is a WAITER line of STATUS <name> detail: Position 1 is next.
type Waiter struct {
	Name     string
	Position int
	ID       string
	Waited   time.Duration
	Session  bool
	Mode     string
	// And: the other names of the waiter's set (and=, in its LOCK's order); nil for a
	// request of one name.
	And []string
}

// Detail is STATUS <name> detail: every holder in grant order, the queue in order.
type Detail struct {
	Status  Status
	Holders []Holder
	Waiters []Waiter
}

// fields reads the key=value words of a line (more may follow in a later version).
func fields(words []string) map[string]string {
	f := map[string]string{}
	for _, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok {
			f[k] = v
		}
	}
	return f
}

// ands reads the and= fields of a detail line (the one key that repeats), in order.
func ands(words []string) []string {
	var names []string
	for _, w := range words {
		if strings.HasPrefix(w, "and=") {
			names = append(names, w[len("and="):])
		}
	}
	return names
}

// note reads a note= field (percent-encoded on the wire); empty for none.
func note(f map[string]string) string {
	n, err := url.PathUnescape(f["note"])
	if err != nil {
		return ""
	}
	return n
}

func num(f map[string]string, k string) uint64 { n, _ := strconv.ParseUint(f[k], 10, 64); return n }
func dur(f map[string]string, k string) time.Duration {
	return time.Duration(num(f, k)) * time.Millisecond
}

// parseStatus reads `<name> free ...` or `<name> held id=.. ...`: a free lock is told by the
// word after its name (a cluster front-end adds fields).
func parseStatus(text string) (Status, error) {
	words := strings.Fields(text)
	if len(words) < 2 || (words[1] != "free" && words[1] != "held") {
		return Status{}, &connError{err: fmt.Errorf("unexpected STATUS line %q", text)}
	}
	if words[1] == "free" {
		return Status{Name: words[0], Free: true}, nil
	}
	f := fields(words[2:])
	s := Status{Name: words[0], ID: f["id"], Token: num(f, "token"), TTL: dur(f, "ttl_ms"),
		Session: f["session"] == "1", Waiters: int(num(f, "waiters")), Holders: 1, Mode: "exclusive",
		Note: note(f)}
	if m, ok := f["mode"]; ok {
		s.Mode, s.Holders = m, int(num(f, "holders"))
	}
	return s, nil
}

// Status is STATUS <name>.
func (c *Client) Status(ctx context.Context, name string) (Status, error) {
	if err := word("name", name); err != nil {
		return Status{}, err
	}
	rest, err := c.request(ctx, "STATUS "+name, c.timeout, nil)
	if err != nil {
		return Status{}, err
	}
	return parseStatus(rest)
}

// StatusAll is STATUS: every held lock (that this user may read), sorted by name.
func (c *Client) StatusAll(ctx context.Context) ([]Status, error) {
	var held []Status
	var perr error
	_, err := c.request(ctx, "STATUS", c.timeout, func(line string) (string, error) {
		for strings.HasPrefix(line, "INFO ") {
			s, e := parseStatus(line[5:])
			if e != nil && perr == nil {
				perr = e
			}
			held = append(held, s)
			var err error
			if line, err = c.readLine(ctx, c.timeout); err != nil {
				return "", err
			}
		}
		return line, nil
	})
	if err == nil {
		err = perr
	}
	return held, err
}

// Detail is STATUS <name> detail.
func (c *Client) Detail(ctx context.Context, name string) (Detail, error) {
	if err := word("name", name); err != nil {
		return Detail{}, err
	}
	var d Detail
	rest, err := c.request(ctx, "STATUS "+name+" detail", c.timeout, func(line string) (string, error) {
		for {
			words := strings.Fields(line)
			switch {
			case len(words) >= 2 && words[0] == "HOLDER":
				f := fields(words[2:])
				d.Holders = append(d.Holders, Holder{Name: words[1], ID: f["id"], Token: num(f, "token"),
					Held: dur(f, "held_ms"), TTL: dur(f, "ttl_ms"), Session: f["session"] == "1", Mode: f["mode"], User: f["user"],
					Note: note(f), And: ands(words[2:])})
			case len(words) >= 3 && words[0] == "WAITER":
				f := fields(words[3:])
				pos, _ := strconv.Atoi(words[2])
				d.Waiters = append(d.Waiters, Waiter{Name: words[1], Position: pos, ID: f["id"],
					Waited: dur(f, "waited_ms"), Session: f["session"] == "1", Mode: f["mode"], And: ands(words[3:])})
			default:
				return line, nil
			}
			var err error
			if line, err = c.readLine(ctx, c.timeout); err != nil {
				return "", err
			}
		}
	})
	if err != nil {
		return Detail{}, err
	}
	d.Status, err = parseStatus(rest)
	return d, err
}

// Event is an EVENT line of a watch. Kind is "acquired", "released", "expired", "dropped"
// or "broken". Note is the new holder's note (acquired events only; "" for none), By who
// broke the lease (broken events only).
type Event struct {
	Kind   string
	Name   string
	ID     string
	Token  uint64
	UnixMs uint64
	Note   string
	By     string
}

// Watcher is the stream of events of one WATCH, on a connection of its own.
type Watcher struct {
	c *Client
}

// Watch starts a WATCH of name ("" for every lock) on a new connection of this client's
// options; read it with Next, end it with Close.
func (c *Client) Watch(ctx context.Context, name string) (*Watcher, error) {
	line := "WATCH"
	if name != "" {
		if err := word("name", name); err != nil {
			return nil, err
		}
		line += " " + name
	}
	w := &Watcher{c: c.Clone()}
	if _, err := w.c.request(ctx, line, c.timeout, nil); err != nil {
		w.c.Close()
		return nil, err
	}
	return w, nil
}

// Next waits for the next event (as long as ctx allows). An ERR (LAGGED, SHUTDOWN, a right
// taken away) or a lost connection ends the watch: Next returns it as the error.
func (w *Watcher) Next(ctx context.Context) (Event, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	for {
		if w.c.conn == nil {
			return Event{}, &connError{err: errors.New("the watch has ended")}
		}
		line, err := w.c.readLine(ctx, 0)
		if err != nil {
			return Event{}, err
		}
		if e := parseErr(line); e != nil {
			w.c.drop(true)
			return Event{}, e
		}
		words := strings.Fields(line)
		if len(words) < 6 || words[0] != "EVENT" {
			continue // an OK (to a QUIT, say): not an event
		}
		token, _ := strconv.ParseUint(words[4], 10, 64)
		at, _ := strconv.ParseUint(words[5], 10, 64)
		e := Event{Kind: words[1], Name: words[2], ID: words[3], Token: token, UnixMs: at}
		// Fields after the fixed words are read by key (a newer lockd may add more).
		for _, f := range words[6:] {
			switch {
			case strings.HasPrefix(f, "note="):
				e.Note = note(map[string]string{"note": strings.TrimPrefix(f, "note=")})
			case strings.HasPrefix(f, "by="):
				e.By = strings.TrimPrefix(f, "by=")
			}
		}
		return e, nil
	}
}

// Close ends the watch.
func (w *Watcher) Close() error { return w.c.Close() }
