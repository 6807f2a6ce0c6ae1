// Package layers holds the test that keeps forkbox's import graph as
// docs/ARCHITECTURE.md draws it: the "layers" block there puts every
// package of the module in one layer (an import may only go to the same
// or a lower layer) and names pairs of groups that may never import each
// other ("never") or that only one group may import ("only"). The block
// is the single source of the rule; the test reads it and `go list`'s
// output of the module.
package layers
