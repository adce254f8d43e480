package agent

import (
	"fmt"
	"testing"
	"time"
)

// TestReconnectWait: the server's pushback lengthens the agent's own
// backoff, never shortens it, and counts for at most
// maxReconnectPushback (a hostile or broken server cannot park the node
// for a day) and at most half of the time the certificate has left.
func TestReconnectWait(t *testing.T) {
	const day = 24 * time.Hour
	cases := []struct {
		backoff, pushback, left, want time.Duration
	}{
		{time.Second, 0, day, time.Second},
		{time.Second, 5 * time.Second, day, 5 * time.Second},
		{30 * time.Second, 5 * time.Second, day, 30 * time.Second},
		{time.Second, day, day, maxReconnectPushback},
		{30 * time.Second, 1 << 62, day, maxReconnectPushback},
		// Near the certificate's end a pushback takes at most half of
		// what is left; the node's own backoff is unchanged.
		{time.Second, 5 * time.Minute, 6 * time.Minute, 3 * time.Minute},
		{time.Second, day, 4 * time.Minute, 2 * time.Minute},
		{30 * time.Second, day, 20 * time.Second, 30 * time.Second},
		{time.Second, day, -time.Minute, time.Second},
	}
	for _, tc := range cases {
		if got := reconnectWait(tc.backoff, tc.pushback, tc.left); got != tc.want {
			t.Errorf("reconnectWait(%v, %v, %v) = %v, want %v", tc.backoff, tc.pushback, tc.left, got, tc.want)
		}
	}
	if maxReconnectPushback != 10*time.Minute {
		t.Errorf("maxReconnectPushback = %v, want the 10 min docs/node.md states", maxReconnectPushback)
	}
}

// TestSessionPushbackThroughWrapping: the pushback streamErr attaches is
// found however the error was wrapped on its way to RunNode.
func TestSessionPushbackThroughWrapping(t *testing.T) {
	err := fmt.Errorf("session: %w", &endedError{err: fmt.Errorf("unavailable"), pushback: 5 * time.Second})
	if got := sessionPushback(err); got != 5*time.Second {
		t.Errorf("sessionPushback = %v, want 5s", got)
	}
	if got := sessionPushback(fmt.Errorf("unavailable")); got != 0 {
		t.Errorf("sessionPushback of an error without one = %v, want 0", got)
	}
}
