// Package keyed holds Mutex, a set of mutexes by key.
package keyed

import "sync"

// Mutex is a set of mutexes by key, each there only while used, so a
// key that is no longer locked costs nothing. The zero value is ready.
type Mutex struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	users int
}

// Lock locks key and returns its unlock, which must be called once.
func (k *Mutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// held is how many keys have a lock now (for tests).
func (k *Mutex) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.locks)
}
