package lockd_test

// The LOCK of a set of names (And) against a fake server on 127.0.0.1 that grants every LOCK
// with one token per name and keeps the lines it got: the words sent (and=<name> per further
// name, before the note), the tokens read back, and the and= fields of STATUS <name> detail.
// No lockd needed. (The set's grant by a real lockd is the conformance scenarios'.)

import (
	"bufio"
	"context"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"lockd"
)

type fakeSets struct {
	l     net.Listener
	short bool // a LOCK gets one token fewer than it has names
	mu    sync.Mutex
	lines []string
}

func startFakeSets(t *testing.T, short bool) *fakeSets {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSets{l: l, short: short}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(conn)
		}
	}()
	return f
}

func (f *fakeSets) serve(conn net.Conn) {
	defer conn.Close()
	lines := bufio.NewScanner(conn)
	for lines.Scan() {
		line := lines.Text()
		f.mu.Lock()
		f.lines = append(f.lines, line)
		f.mu.Unlock()
		reply := "OK PONG\n"
		switch {
		case strings.HasPrefix(line, "LOCK "):
			names := 1
			for _, w := range strings.Fields(strings.SplitN(line, " note=", 2)[0]) {
				if strings.HasPrefix(w, "and=") {
					names++
				}
			}
			if f.short {
				names--
			}
			tokens := []string{}
			for i := 0; i < names; i++ {
				tokens = append(tokens, strconv.Itoa(40+i))
			}
			reply = "OK " + strings.Join(tokens, " ") + "\n"
		case strings.HasPrefix(line, "STATUS "):
			reply = "HOLDER db-migrate id=ci-7 token=40 held_ms=5 ttl_ms=9 session=0 mode=exclusive granted=1700000000000 and=cache-flush note=two%20names\n" +
				"WAITER db-migrate 1 id=ci-8 waited_ms=3 session=0 mode=shared and=cache-flush and=queue\n" +
				"WAITER db-migrate 2 id=ci-9 waited_ms=1 session=0 mode=exclusive\n" +
				"OK db-migrate held id=ci-7 token=40 ttl_ms=9 session=0 waiters=2 note=two%20names\n"
		}
		conn.Write([]byte(reply))
	}
}

func (f *fakeSets) lastLock() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(f.lines[i], "LOCK ") {
			return f.lines[i]
		}
	}
	return ""
}

func TestASetSendsAndWordsAndReturnsATokenPerName(t *testing.T) {
	f := startFakeSets(t, false)
	c, err := lockd.New(lockd.Options{Addrs: []string{f.l.Addr().String()}, ID: "ci-7", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	tokens, err := c.LockTokens(ctx, "db-migrate", lockd.TTL(10*time.Minute), lockd.And("cache-flush"), lockd.And("queue"), lockd.Note("two names"))
	if err != nil || !reflect.DeepEqual(tokens, []uint64{40, 41, 42}) {
		t.Fatalf("LockTokens: %v %v", tokens, err)
	}
	line := f.lastLock()
	if !strings.HasPrefix(line, "LOCK db-migrate ci-7 ttl=600000ms") || !strings.HasSuffix(line, " and=cache-flush and=queue note=two names") {
		t.Fatalf("sent %q", line)
	}
	// Lock gives the first name's token; of one name, its token alone.
	if token, err := c.Lock(ctx, "db-migrate", lockd.And("cache-flush")); err != nil || token != 40 {
		t.Fatalf("Lock of a set: %v %v", token, err)
	}
	if tokens, err := c.LockTokens(ctx, "db-migrate"); err != nil || !reflect.DeepEqual(tokens, []uint64{40}) {
		t.Fatalf("LockTokens of one name: %v %v", tokens, err)
	}
	if line := f.lastLock(); strings.Contains(line, "and=") {
		t.Fatalf("one name sent %q", line)
	}
}

func TestAReplyWithoutATokenPerNameIsAnError(t *testing.T) {
	f := startFakeSets(t, true)
	c, _ := lockd.New(lockd.Options{Addrs: []string{f.l.Addr().String()}, ID: "ci-7", Timeout: 5 * time.Second})
	defer c.Close()
	if tokens, err := c.LockTokens(context.Background(), "a", lockd.And("b", "c")); err == nil || !errors.Is(err, lockd.ErrConnection) {
		t.Fatalf("a short reply gave %v %v", tokens, err)
	}
}

func TestASetIsCheckedBeforeItIsSent(t *testing.T) {
	f := startFakeSets(t, false)
	c, _ := lockd.New(lockd.Options{Addrs: []string{f.l.Addr().String()}, ID: "ci-7", Timeout: 5 * time.Second})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Lock(ctx, "a", lockd.And("b c")); err == nil {
		t.Fatal("a name with a space was sent")
	}
	if _, err := c.Lock(ctx, "a", lockd.And("b"), lockd.Supersede()); err == nil {
		t.Fatal("supersede with And was sent")
	}
	if line := f.lastLock(); line != "" {
		t.Fatalf("sent %q", line)
	}
}

func TestDetailNamesASetsOtherNames(t *testing.T) {
	f := startFakeSets(t, false)
	c, _ := lockd.New(lockd.Options{Addrs: []string{f.l.Addr().String()}, ID: "ci-7", Timeout: 5 * time.Second})
	defer c.Close()
	d, err := c.Detail(context.Background(), "db-migrate")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Holders) != 1 || !reflect.DeepEqual(d.Holders[0].And, []string{"cache-flush"}) || d.Holders[0].Note != "two names" {
		t.Fatalf("holders %+v", d.Holders)
	}
	if len(d.Waiters) != 2 || !reflect.DeepEqual(d.Waiters[0].And, []string{"cache-flush", "queue"}) || d.Waiters[1].And != nil {
		t.Fatalf("waiters %+v", d.Waiters)
	}
}
