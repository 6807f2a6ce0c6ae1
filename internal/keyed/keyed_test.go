package keyed

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestSameKeyExcludes runs many lockers of one key and of another at
// once: those of one key never overlap, and no lock is left afterwards.
func TestSameKeyExcludes(t *testing.T) {
	var k Mutex
	var inA, maxA atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			unlock := k.Lock("a")
			if n := inA.Add(1); n > maxA.Load() {
				maxA.Store(n)
			}
			inA.Add(-1)
			unlock()
		}()
		go func() {
			defer wg.Done()
			k.Lock("b")()
		}()
	}
	wg.Wait()
	if maxA.Load() != 1 {
		t.Errorf("%d holders of key a at once", maxA.Load())
	}
	if n := k.held(); n != 0 {
		t.Errorf("%d keys still held", n)
	}
}

// TestKeysIndependent proves a held key does not block another.
func TestKeysIndependent(t *testing.T) {
	var k Mutex
	unlockA := k.Lock("a")
	done := make(chan struct{})
	go func() { k.Lock("b")(); close(done) }()
	<-done
	unlockA()
}
