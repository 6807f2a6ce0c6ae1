package drivertest

import (
	"context"
	"sync"
	"testing"
)

// testStatsRepeated: Stats answers every time, many calls at once (a
// reader of the runtime's output that lost a race with its exit, as
// go-runc's Stats does when its process exits before the JSON is read,
// fails some of them: "read |0: file already closed").
func (e *env) testStatsRepeated(t *testing.T) {
	sb := e.start(t, defaultLimits)
	ctx := context.Background()
	defer func() { _ = e.driver.Delete(ctx, sb.id) }()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				if _, err := e.driver.Stats(ctx, sb.id); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n == 0 {
			t.Errorf("stats: %v", err)
		}
		n++
	}
	if n > 0 {
		t.Errorf("%d of 64 Stats calls failed", n)
	}
}
