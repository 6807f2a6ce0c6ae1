package template

import (
	"context"

	"github.com/forkbox/forkbox/storage"
)

// SetWarmSnapshot records snapshot id ("" for none) as template name's
// storage.Template.WarmSnapshot, the memory snapshot of its started
// server. ErrNotFound when ctx's caller sees no such template.
func (c *Catalog) SetWarmSnapshot(ctx context.Context, name, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, err := c.Get(ctx, name)
	if err != nil {
		return err
	}
	t.WarmSnapshot = id
	return storage.SaveTemplate(c.layout.Template(name), t)
}
