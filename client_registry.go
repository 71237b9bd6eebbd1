package kernrpc

import (
	"context"
	"fmt"

	"github.com/kernrpc/kernrpc/kernel"
)

// followRegistry gives the balancer the service's instances and keeps
// following them: through kernel.Notifier where the registry offers it,
// which keeps no goroutine waiting (a client made for one call starts
// none for its registry), else on a goroutine reading the registry's
// Watch.
func (c *Client) followRegistry(ctx context.Context) error {
	if n, ok := c.registry.(kernel.Notifier); ok {
		// Held until the current set is in: a change handed to
		// applyReport meanwhile waits, and so cannot be overtaken by it.
		c.followMu.Lock()
		defer c.followMu.Unlock()
		insts, stop, err := n.Notify(ctx, c.service, c.applyReport)
		if err != nil {
			return c.registryError(fmt.Errorf("resolve %q: %w", c.service, err))
		}
		c.useInstances(insts)
		c.stopWatch = stop
		close(c.watchDone)
		return nil
	}
	insts, err := c.registry.Resolve(ctx, c.service)
	if err != nil {
		return c.registryError(fmt.Errorf("resolve %q: %w", c.service, err))
	}
	c.balancer.Update(insts)
	c.instances.Store(int64(len(insts)))
	c.dropPoolsNotIn(insts) // no pool yet: it notes the addresses listed
	wctx, stop := context.WithCancel(context.Background())
	updates, err := c.registry.Watch(wctx, c.service)
	if err != nil {
		stop()
		return c.registryError(fmt.Errorf("watch %q: %w", c.service, err))
	}
	c.stopWatch = stop
	go c.follow(updates)
	return nil
}

func (c *Client) registryError(err error) error {
	return &kernel.PluginError{Source: c.cfg.Source, Kind: kernel.KindRegistry, Name: c.cfg.Registry.Name, Err: err}
}

// follow applies the reports of the registry's Watch until it ends.
func (c *Client) follow(updates <-chan []kernel.Instance) {
	defer close(c.watchDone)
	for insts := range updates {
		c.applyReport(insts)
	}
}

// applyReport takes a registry report: it feeds the balancer, drops the
// pools of instances that left, and wakes the calls waiting for an
// instance.
func (c *Client) applyReport(insts []kernel.Instance) {
	c.followMu.Lock()
	defer c.followMu.Unlock()
	c.useInstances(insts)
}

// useInstances is applyReport under followMu.
func (c *Client) useInstances(insts []kernel.Instance) {
	c.listAlso(insts)
	c.balancer.Update(insts)
	c.instances.Store(int64(len(insts)))
	c.registryUpdates.Add(1)
	c.dropPoolsNotIn(insts)
	fresh := make(chan struct{})
	close(*c.updated.Swap(&fresh))
}

// listAlso adds insts to the instances a pool may be made for, before
// the balancer is given them: a call may pick a newcomer as soon as the
// balancer has it, before dropPoolsNotIn lists it, and must not take it
// for one that left (see pool). Those the report leaves out stay listed
// until dropPoolsNotIn, which retires a pool made for them meanwhile.
func (c *Client) listAlso(insts []kernel.Instance) {
	c.poolsMu.Lock()
	defer c.poolsMu.Unlock()
	c.listed = append(c.listed[:len(c.listed):len(c.listed)], insts...)
}

// dropPoolsNotIn keeps insts, the instances listed now, for pool, and
// retires the pools of the others, keeping them in c.retired for Close
// while their connections still carry calls or streams. With no pool yet
// (the first set, which a client made for one call gets alone), there is
// nothing to build.
func (c *Client) dropPoolsNotIn(insts []kernel.Instance) {
	c.poolsMu.Lock()
	defer c.poolsMu.Unlock()
	c.listed = insts
	for p := range c.retired {
		if !p.carries() {
			delete(c.retired, p)
		}
	}
	old := *c.pools.Load()
	if len(old) == 0 {
		return
	}
	live := make(map[string]bool, len(insts))
	for _, in := range insts {
		live[in.Address] = true
	}
	next := make(map[string]*connPool, len(old))
	for addr, p := range old {
		if live[addr] {
			next[addr] = p
		} else {
			p.retire()
			if c.retired == nil {
				c.retired = make(map[*connPool]struct{})
			}
			c.retired[p] = struct{}{}
		}
	}
	c.pools.Store(&next)
}
