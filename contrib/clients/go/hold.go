package lockd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// DefaultTTL is WithLock's lease when no TTL option is given.
const DefaultTTL = 30 * time.Second

// DefaultGrace is WithLock's session grace (at most the ttl): how long the server keeps the
// lease after its connection drops, for the renewals to reconnect.
const DefaultGrace = 10 * time.Second

// WithLock takes the lock, runs fn with a context and the fencing token, renews the lease in
// the background and releases it when fn returns (or panics).
//
// The lease is a session lease with a grace (DefaultGrace unless a Session option says
// otherwise, at most the ttl) on a connection of its own: a killed process frees the lock one
// grace later, and a dropped connection is ridden out by reconnecting within it. Renewals go
// every third of the time the lease surely lives without one (the grace, or the ttl if
// shorter). When the lease can no longer be trusted (a renewal refused, or none got through
// before that time, less a margin) fn's context is cancelled at once, before the server can
// grant the lock to anyone else; WithLock then returns an error that errors.Is ErrLeaseLost
// (after fn returns: fn must stop when its context is done).
func (c *Client) WithLock(ctx context.Context, name string, fn func(ctx context.Context, token uint64) error, options ...LockOption) error {
	o := lockOpts{tie: "session", grace: DefaultGrace, ttl: DefaultTTL}
	for _, opt := range options {
		opt(&o)
	}
	if o.grace > o.ttl {
		o.grace = o.ttl
	}
	options = append(options, TTL(o.ttl))
	if o.tie == "session" {
		options = append(options, Session(o.grace))
	}
	hold := o.ttl
	if o.tie == "session" && o.grace > 0 {
		hold = o.grace
	}
	rc := c.Clone()
	defer rc.Close()
	token, err := rc.Lock(ctx, name, options...)
	if err != nil {
		return err
	}
	// A renewal at once: the lease runs from its grant, which a LOCK that waited does not
	// tell the time of; a renewal's is no later than when it was sent.
	sent := time.Now()
	if _, err := rc.Renew(ctx, name, token, 0); err != nil {
		release(rc, name, token)
		return err
	}
	k := &keeper{c: rc, name: name, token: token, hold: hold, last: sent}
	work, cancel := context.WithCancel(ctx)
	defer cancel()
	k.cancel = cancel
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.run(stop)
	}()
	defer func() {
		close(stop)
		<-done
		if k.lost() == nil {
			release(rc, name, token)
		}
	}()
	err = fn(work, token)
	if lost := k.lost(); lost != nil {
		return lost
	}
	return err
}

// release unlocks, once more on a new connection if this one has dropped.
func release(c *Client, name string, token uint64) {
	for try := 0; try < 2; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		err := c.Unlock(ctx, name, token)
		cancel()
		if err == nil || !errors.Is(err, ErrConnection) {
			return
		}
	}
}

// keeper renews one lease and says when it is lost.
type keeper struct {
	c      *Client
	name   string
	token  uint64
	hold   time.Duration
	last   time.Time // when the latest renewal that got through was sent
	cancel context.CancelFunc

	mu  sync.Mutex
	err error
}

func (k *keeper) lost() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

func (k *keeper) markLost(why string) {
	k.mu.Lock()
	if k.err == nil {
		k.err = fmt.Errorf("%w: %s (token %d): %s", ErrLeaseLost, k.name, k.token, why)
	}
	k.mu.Unlock()
	k.cancel()
}

// margin is how long before the lease's earliest possible end the keeper gives up: time for
// the cancellation to reach the work.
func (k *keeper) margin() time.Duration {
	m := k.hold / 10
	if m < 50*time.Millisecond {
		m = 50 * time.Millisecond
	}
	return m
}

func (k *keeper) run(stop <-chan struct{}) {
	for {
		// The lease surely lives until last+hold (the server extends it from when it read the
		// renewal, which was after it was sent); give up a margin before that.
		giveUp := k.last.Add(k.hold - k.margin())
		next := k.last.Add(k.hold / 3)
		if d := time.Until(next); d > 0 {
			select {
			case <-stop:
				return
			case <-time.After(d):
			}
		}
		for {
			if !time.Now().Before(giveUp) {
				k.markLost(fmt.Sprintf("no renewal got through within %v", k.hold-k.margin()))
				return
			}
			sent := time.Now()
			ctx, cancel := context.WithDeadline(context.Background(), giveUp)
			_, err := k.c.Renew(ctx, k.name, k.token, 0)
			cancel()
			if err == nil {
				k.last = sent
				break
			}
			if !retryable(err) && !errors.Is(err, context.DeadlineExceeded) {
				k.markLost(err.Error())
				return
			}
			select { // the server may be restarting, or another front-end may serve
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
