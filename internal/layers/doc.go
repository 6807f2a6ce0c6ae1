// Package layers holds the test that keeps forkbox's import graph
// layered as docs/ARCHITECTURE.md draws it: the "layers" block there names
// every package of the module in one layer, and an import may only go to a
// package of the same or a lower layer. The block is the single source of
// the rule; the test reads it and `go list`'s output of the module.
package layers
