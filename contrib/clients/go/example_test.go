package lockd_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"lockd"
)

// deploy stands for the work done under the lock: it stops when ctx is done.
func deploy(ctx context.Context, token uint64) error {
	fmt.Fprintln(os.Stderr, "deploying with fencing token", token)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Millisecond):
		return nil
	}
}

// The README's example: a function run under the lock, renewed in the background.
func ExampleClient_WithLock() {
	// README begin
	c, err := lockd.New(lockd.Options{}) // $LOCKD_ADDR, or 127.0.0.1:5001
	if err != nil {
		log.Fatal(err)
	}
	err = c.WithLock(context.Background(), "deploy", func(ctx context.Context, token uint64) error {
		return deploy(ctx, token) // ctx is cancelled the moment the lease is lost
	}, lockd.TTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// README end
}

// The example runs, against a real lockd.
func TestExampleRuns(t *testing.T) {
	w := &world{bin: lockdBin(t)}
	if err := w.start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	t.Setenv("LOCKD_ADDR", w.addr)
	ExampleClient_WithLock()
	c, _ := lockd.New(lockd.Options{})
	if s, err := c.Status(context.Background(), "deploy"); err != nil || !s.Free {
		t.Fatalf("deploy is not free after the example: %+v %v", s, err)
	}
}
