package lockd_test

// The conformance scenarios (../conformance/scenarios.json; its README says the format),
// played by this client against a real lockd per scenario. LOCKD_BIN names the binary
// (default: the repository's target/release/lockd, then target/debug/lockd). A lock step's
// "and" names are lockd.And, its tokens LockTokens'; a detail entry's "and" its Holder's or
// Waiter's And.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"lockd"
)

const guard = 10 * time.Second

type doc struct {
	Users     map[string]struct{ Secret, Rights string }
	Scenarios []struct {
		Name   string
		Needs  []string
		Server struct{ TLS, Auth bool }
		Steps  []map[string]any
	}
}

type pending struct {
	done   chan struct{}
	names  []string // the LOCK's own name, then its "and" names
	tokens []uint64 // one per name
	err    error
	at     time.Time
}

type held struct {
	got    chan uint64 // the token, once the function runs
	ttl    time.Duration
	end    chan struct{}
	lost   chan struct{}
	lostAt time.Time
	result chan error
}

type world struct {
	d       *doc
	bin     string
	args    []string
	addr    string
	cmd     *exec.Cmd
	pki     string
	tmp     string
	clients map[string]*lockd.Client
	watches map[string]*lockd.Watcher
	tokens  map[string]uint64
	pending map[string]*pending
	holds   map[string]*held
	frozeAt time.Time
	proxy   net.Listener
	cut     chan struct{} // closed by the cut step
	mu      sync.Mutex
	through []net.Conn // every connection through the proxy, both sides
	fakes   []net.Listener
}

// startUnavailable is a fake front-end cut off from etcd: OK PONG to PING, ERR UNAVAILABLE
// to everything else.
func (w *world) startUnavailable() string {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	w.fakes = append(w.fakes, l)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				lines := bufio.NewScanner(conn)
				for lines.Scan() {
					reply := "ERR UNAVAILABLE etcd has no leader; try again\n"
					if strings.EqualFold(strings.TrimSpace(lines.Text()), "PING") {
						reply = "OK PONG\n"
					}
					conn.Write([]byte(reply))
				}
			}()
		}
	}()
	return l.Addr().String()
}

// startProxy forwards 127.0.0.1:<port> to lockd until the cut, after which it passes nothing
// (and keeps every connection open).
func (w *world) startProxy() string {
	if w.proxy == nil {
		w.proxy, _ = net.Listen("tcp", "127.0.0.1:0")
		go func() {
			for {
				in, err := w.proxy.Accept()
				if err != nil {
					return
				}
				out, err := net.Dial("tcp", w.addr)
				if err != nil {
					in.Close()
					continue
				}
				w.mu.Lock()
				w.through = append(w.through, in, out)
				w.mu.Unlock()
				pump := func(dst, src net.Conn) {
					buf := make([]byte, 4096)
					for {
						n, err := src.Read(buf)
						select {
						case <-w.cut:
							<-make(chan struct{}) // blocked: nothing passes, nothing closes
						default:
						}
						if err != nil {
							dst.Close()
							return
						}
						dst.Write(buf[:n])
					}
				}
				go pump(out, in)
				go pump(in, out)
			}
		}()
	}
	return w.proxy.Addr().String()
}

func lockdBin(t *testing.T) string {
	if bin := os.Getenv("LOCKD_BIN"); bin != "" {
		return bin
	}
	for _, p := range []string{"../../../target/release/lockd", "../../../target/debug/lockd"} {
		if _, err := os.Stat(p); err == nil {
			abs, _ := filepath.Abs(p)
			return abs
		}
	}
	t.Fatal("no lockd: set LOCKD_BIN or build it (cargo build)")
	return ""
}

var listening = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)

func (w *world) start(listen string) error {
	cmd := exec.Command(w.bin, append([]string{"--listen", listen}, w.args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LOCKD_") && !strings.HasPrefix(kv, "RUST_LOG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return err
	}
	found := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			if strings.Contains(s.Text(), "listening") {
				if a := listening.FindString(s.Text()); a != "" {
					select {
					case found <- a:
					default:
					}
				}
			}
		}
	}()
	select {
	case w.addr = <-found:
		w.cmd = cmd
		return nil
	case <-time.After(guard):
		cmd.Process.Kill()
		return errors.New("lockd did not say where it listens")
	}
}

func (w *world) stop() {
	if w.cmd != nil {
		w.cmd.Process.Signal(syscall.SIGCONT)
		w.cmd.Process.Kill()
		w.cmd.Wait()
	}
}

func (w *world) options(name string, step map[string]any) lockd.Options {
	o := lockd.Options{ID: name, Addrs: []string{w.addr}, Timeout: 5 * time.Second}
	if step["id"] == "default" {
		o.ID = ""
	}
	if step["via"] == "proxy" {
		o.Addrs = []string{w.startProxy()}
	}
	if addrs, ok := step["addrs"].([]any); ok {
		o.Addrs = nil
		for _, a := range addrs {
			if a == "proxy" {
				o.Addrs = append(o.Addrs, w.startProxy())
			} else if a == "unavailable" {
				o.Addrs = append(o.Addrs, w.startUnavailable())
			} else if a == "dead" {
				l, _ := net.Listen("tcp", "127.0.0.1:0")
				o.Addrs = append(o.Addrs, l.Addr().String())
				l.Close()
			} else {
				o.Addrs = append(o.Addrs, w.addr)
			}
		}
	}
	if w.pki != "" {
		o.CAFile, o.CertFile, o.KeyFile = w.pki+"/ca.pem", w.pki+"/client.pem", w.pki+"/client.key"
	}
	if user, ok := step["user"].(string); ok {
		o.User = user
		secret := w.d.Users[user].Secret
		switch step["secret"] {
		case "env":
			os.Setenv("LOCKD_SECRET", secret) // read by New, unset after it
		case "file":
			o.SecretFile = filepath.Join(w.tmp, user+".secret")
			os.WriteFile(o.SecretFile, []byte(secret+"\n"), 0o600)
		default:
			o.Secret = "not-the-secret-0123456789"
		}
	}
	return o
}

func ms(v any) time.Duration { f, _ := v.(float64); return time.Duration(f) * time.Millisecond }

func (w *world) token(v any) uint64 {
	if s, ok := v.(string); ok {
		return w.tokens[s]
	}
	f, _ := v.(float64)
	return uint64(f)
}

func (w *world) lockOptions(step map[string]any) []lockd.LockOption {
	var o []lockd.LockOption
	if v, ok := step["ttl_ms"]; ok {
		o = append(o, lockd.TTL(ms(v)))
	}
	if v, ok := step["wait_ms"]; ok {
		o = append(o, lockd.Wait(ms(v)))
	}
	if step["session"] == true {
		o = append(o, lockd.Session(ms(step["grace_ms"])))
	}
	if step["detach"] == true {
		o = append(o, lockd.Detach())
	}
	if step["shared"] == true {
		o = append(o, lockd.Shared())
	}
	if v, ok := step["limit"].(float64); ok {
		o = append(o, lockd.Limit(int(v)))
	}
	if step["supersede"] == true {
		o = append(o, lockd.Supersede())
	}
	if v, ok := step["note"].(string); ok {
		o = append(o, lockd.Note(v))
	}
	if names := andNames(step); len(names) > 0 {
		o = append(o, lockd.And(names...))
	}
	return o
}

// andNames is a lock step's "and": the further names of a set.
func andNames(step map[string]any) []string {
	var names []string
	list, _ := step["and"].([]any)
	for _, n := range list {
		names = append(names, n.(string))
	}
	return names
}

// code is the ERR code of err, read from its type.
func code(err error) string {
	var e *lockd.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return fmt.Sprintf("no ERR code (%v)", err)
}

func outcome(got any, err error, step map[string]any, w *world) error {
	want, _ := step["expect"].(string)
	switch {
	case err != nil && want != "" && code(err) == want:
		return nil
	case err != nil:
		return fmt.Errorf("%v; expected %q", err, want)
	case want != "":
		return fmt.Errorf("answered %v; expected %s", got, want)
	}
	result, ok := step["result"].(map[string]any)
	if !ok {
		return nil
	}
	have, _ := json.Marshal(got)
	var m map[string]any
	json.Unmarshal(have, &m)
	for k, v := range result {
		if k == "token" {
			v = float64(w.token(v))
		}
		if list, ok := v.([]any); ok {
			for _, item := range list {
				if e, ok := item.(map[string]any); ok && e["token"] != nil {
					e["token"] = float64(w.token(e["token"]))
				}
			}
		}
		if !reflect.DeepEqual(m[k], v) {
			return fmt.Errorf("answered %s; expected %s=%v", have, k, v)
		}
	}
	return nil
}

func status(s lockd.Status) map[string]any {
	if s.Free {
		return map[string]any{"free": true}
	}
	return map[string]any{"id": s.ID, "token": s.Token, "waiters": s.Waiters, "holders": s.Holders, "session": s.Session, "mode": s.Mode, "note": s.Note}
}

func (w *world) step(step map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	op, _ := step["op"].(string)
	client, _ := step["client"].(string)
	name, _ := step["name"].(string)
	c := w.clients[client]
	switch op {
	case "connect":
		o := w.options(client, step)
		cl, err := lockd.New(o)
		os.Unsetenv("LOCKD_SECRET")
		if err == nil {
			err = cl.Ping(ctx)
			w.clients[client] = cl
		}
		return outcome(nil, err, step, w)
	case "lock":
		p := &pending{done: make(chan struct{}), names: append([]string{name}, andNames(step)...)}
		as, _ := step["as"].(string)
		w.pending[as] = p
		go func() {
			p.tokens, p.err = c.LockTokens(context.Background(), name, w.lockOptions(step)...)
			p.at = time.Now()
			close(p.done)
		}()
		if step["async"] == true {
			return nil
		}
		return w.await(as, step)
	case "await":
		if h, ok := w.holds[step["of"].(string)]; ok {
			return w.granted(ctx, step["of"].(string), h)
		}
		return w.await(step["of"].(string), step)
	case "pending":
		pause := 300 * time.Millisecond
		if v, ok := step["ms"]; ok {
			pause = ms(v)
		}
		time.Sleep(pause)
		if h, ok := w.holds[step["of"].(string)]; ok {
			if len(h.got) > 0 || len(h.result) > 0 {
				return errors.New("WithLock's function runs (or it returned); it should still wait")
			}
			return nil
		}
		select {
		case <-w.pending[step["of"].(string)].done:
			return errors.New("the LOCK was answered; it should still wait")
		default:
			return nil
		}
	case "distinct":
		seen := map[uint64]string{}
		for _, t := range step["tokens"].([]any) {
			tok := w.tokens[t.(string)]
			if other, ok := seen[tok]; ok {
				return fmt.Errorf("%s and %s are the same token, %d", other, t, tok)
			}
			seen[tok] = t.(string)
		}
		return nil
	case "unlock":
		return outcome(nil, c.Unlock(ctx, name, w.token(step["token"])), step, w)
	case "renew", "check":
		var left time.Duration
		var err error
		if op == "renew" {
			left, err = c.Renew(ctx, name, w.token(step["token"]), ms(step["ttl_ms"]))
		} else {
			left, err = c.Check(ctx, name, w.token(step["token"]))
		}
		if err == nil && left <= 0 {
			return errors.New("no lease left")
		}
		return outcome(nil, err, step, w)
	case "status":
		s, err := c.Status(ctx, name)
		return outcome(status(s), err, step, w)
	case "status_all":
		all, err := c.StatusAll(ctx)
		names := []any{}
		for _, s := range all {
			names = append(names, s.Name)
		}
		return outcome(map[string]any{"names": names}, err, step, w)
	case "detail":
		d, err := c.Detail(ctx, name)
		if d.Status.Free {
			return outcome(map[string]any{"free": true}, err, step, w)
		}
		// A set's other names ("and") are named only where it has them (the lists compare
		// whole).
		hs, ws := []any{}, []any{}
		for _, h := range d.Holders {
			e := map[string]any{"id": h.ID, "token": h.Token, "mode": h.Mode}
			if len(h.And) > 0 {
				e["and"] = h.And
			}
			hs = append(hs, e)
		}
		for _, x := range d.Waiters {
			e := map[string]any{"id": x.ID, "position": x.Position, "mode": x.Mode}
			if len(x.And) > 0 {
				e["and"] = x.And
			}
			ws = append(ws, e)
		}
		return outcome(map[string]any{"holders": hs, "waiters": ws}, err, step, w)
	case "watch":
		watch, err := c.Watch(ctx, name)
		w.watches[client] = watch
		return outcome(nil, err, step, w)
	case "event":
		e, err := w.watches[client].Next(ctx)
		return outcome(map[string]any{"kind": e.Kind, "name": e.Name, "id": e.ID, "token": e.Token}, err, step, w)
	case "hold":
		return w.hold(ctx, client, name, step)
	case "end":
		h := w.holds[step["of"].(string)]
		close(h.end)
		select {
		case err := <-h.result:
			return err
		case <-time.After(guard):
			return errors.New("WithLock did not return")
		}
	case "lost":
		h := w.holds[step["of"].(string)]
		select {
		case <-h.lost:
		case <-time.After(guard):
			return errors.New("no loss signalled")
		}
		select {
		case err := <-h.result:
			if !errors.Is(err, lockd.ErrLeaseLost) {
				return fmt.Errorf("WithLock returned %v, not ErrLeaseLost", err)
			}
		case <-time.After(guard):
			return errors.New("WithLock did not return after the loss")
		}
		if of, ok := step["before"].(string); ok && !h.lostAt.Before(w.pending[of].at) {
			return fmt.Errorf("the loss was signalled %v after %s was granted", h.lostAt.Sub(w.pending[of].at), of)
		}
		if step["within_ttl_of_freeze"] == true && h.lostAt.After(w.frozeAt.Add(h.ttl)) {
			return fmt.Errorf("the loss was signalled %v after the freeze began (ttl %v)", h.lostAt.Sub(w.frozeAt), h.ttl)
		}
		return nil
	case "sleep":
		time.Sleep(ms(step["ms"]))
		return nil
	case "freeze":
		w.frozeAt = time.Now()
		w.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(ms(step["ms"]))
		return w.cmd.Process.Signal(syscall.SIGCONT)
	case "cut":
		close(w.cut)
		return nil
	case "drop":
		w.mu.Lock()
		for _, c := range w.through {
			c.Close()
		}
		w.through = nil
		w.mu.Unlock()
		return nil
	case "restart":
		w.stop()
		return w.start(w.addr)
	}
	return fmt.Errorf("unknown op %q", op)
}

func (w *world) await(of string, step map[string]any) error {
	p := w.pending[of]
	select {
	case <-p.done:
	case <-time.After(guard):
		return errors.New("the LOCK was not answered")
	}
	if p.err == nil {
		if len(p.tokens) != len(p.names) {
			return fmt.Errorf("granted %v for %v: not a token per name", p.tokens, p.names)
		}
		// of is the first name's token, of.<name> each name's.
		w.tokens[of] = p.tokens[0]
		for i, n := range p.names {
			w.tokens[of+"."+n] = p.tokens[i]
		}
	}
	return outcome(nil, p.err, step, w)
}

func (w *world) hold(ctx context.Context, client, name string, step map[string]any) error {
	c, err := lockd.New(w.options(client, step))
	if err != nil {
		return err
	}
	h := &held{got: make(chan uint64, 1), ttl: ms(step["ttl_ms"]), end: make(chan struct{}), lost: make(chan struct{}), result: make(chan error, 1)}
	as := step["as"].(string)
	w.holds[as] = h
	got := h.got
	go func() {
		h.result <- c.WithLock(context.Background(), name, func(ctx context.Context, token uint64) error {
			got <- token
			select {
			case <-h.end:
			case <-ctx.Done():
				h.lostAt = time.Now()
				close(h.lost)
			}
			return nil
		}, lockd.TTL(h.ttl))
	}()
	if step["async"] == true {
		return nil
	}
	return w.granted(ctx, as, h)
}

// granted waits for the function of the hold as to run, and saves its token.
func (w *world) granted(ctx context.Context, as string, h *held) error {
	select {
	case w.tokens[as] = <-h.got:
		return nil
	case err := <-h.result:
		return fmt.Errorf("WithLock: %v", err)
	case <-ctx.Done():
		return errors.New("WithLock did not get the lock")
	}
}

func TestConformance(t *testing.T) {
	data, err := os.ReadFile("../conformance/scenarios.json")
	if err != nil {
		t.Fatal(err)
	}
	var d doc
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	bin := lockdBin(t)
	for _, sc := range d.Scenarios {
		sc := sc
		t.Run(sc.Name, func(t *testing.T) {
			w := &world{d: &d, bin: bin, tmp: t.TempDir(), clients: map[string]*lockd.Client{},
				watches: map[string]*lockd.Watcher{}, tokens: map[string]uint64{},
				pending: map[string]*pending{}, holds: map[string]*held{}, cut: make(chan struct{})}
			if sc.Server.TLS {
				w.pki = w.tmp
				if out, err := exec.Command("../conformance/make-pki", w.pki).CombinedOutput(); err != nil {
					t.Fatalf("make-pki: %v\n%s", err, out)
				}
				w.args = append(w.args, "--tls-cert", w.pki+"/server.pem", "--tls-key", w.pki+"/server.key", "--tls-client-ca", w.pki+"/ca.pem")
			}
			if sc.Server.Auth {
				w.args = append(w.args, "--auth-file", authFile(t, &d, bin, w.tmp))
			}
			if err := w.start("127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			defer w.stop()
			defer func() {
				if w.proxy != nil {
					w.proxy.Close()
				}
				for _, l := range w.fakes {
					l.Close()
				}
			}()
			for i, step := range sc.Steps {
				if err := w.step(step); err != nil {
					js, _ := json.Marshal(step)
					t.Fatalf("step %d %s: %v", i+1, js, err)
				}
			}
		})
	}
}

// authFile writes the scenarios' users, each line made by lockd --auth-hash.
func authFile(t *testing.T, d *doc, bin, dir string) string {
	var text strings.Builder
	for user, u := range d.Users {
		cmd := exec.Command(bin, "--auth-hash", user+" "+u.Rights)
		cmd.Stdin = strings.NewReader(u.Secret + "\n")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("lockd --auth-hash: %v", err)
		}
		text.Write(out)
	}
	file := filepath.Join(dir, "users")
	os.WriteFile(file, []byte(text.String()), 0o600)
	return file
}
