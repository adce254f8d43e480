package agent

import (
	"context"
	"time"
)

// SetSleep makes the agent configured by c call f for each wait before
// its next session instead of waiting, so a test sees the wait chosen.
func SetSleep(c *NodeConfig, f func(ctx context.Context, d time.Duration) error) {
	c.sleep = f
}
