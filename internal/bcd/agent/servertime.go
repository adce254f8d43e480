package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/pki"
)

// ClockOffset asks the control plane for its time over TLS pinned to the
// serving CA, without a session (so it never disturbs the node's live
// one), and returns the local clock's offset from the server's, corrected
// by half the round trip.
func ClockOffset(ctx context.Context, server, serverName string, servingCA pki.Pin) (time.Duration, error) {
	conn, guard, _, err := Dial([]string{server}, serverName, servingCA, nil)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := joinv1.NewJoinServiceClient(conn).GetWellKnown(ctx, &joinv1.GetWellKnownRequest{})
	end := time.Now()
	if perr := guard.Err(); perr != nil {
		return 0, fmt.Errorf("the control plane at %s is not the one the pins name: %w", server, perr)
	}
	if err != nil {
		return 0, fmt.Errorf("reach the control plane at %s: %w", server, err)
	}
	if resp.ServerTimeUnixNano == 0 {
		return 0, fmt.Errorf("the control plane at %s did not say its time", server)
	}
	mid := start.Add(end.Sub(start) / 2)
	return mid.Sub(time.Unix(0, resp.ServerTimeUnixNano)), nil
}
