package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var exportCases = []testCase{
	{"export holds survive, keep their allowance and are bounded", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		h := store.ExportHold{Digest: "sha256:aa", Nodes: 2, Withdrawals: 2, Bans: 1, Detail: "withdraw web-1, web-2", LastHeld: at(0)}
		if err := s.HoldExport(ctx, h, 3); err != nil {
			t.Fatalf("HoldExport: %v", err)
		}
		if _, err := s.GetExportHold(ctx, "sha256:bb"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("GetExportHold(unknown): %v, want ErrNotFound", err)
		}
		if _, err := s.AllowExport(ctx, "sha256:bb", "owner", at(time.Minute), nil); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("AllowExport(not held): %v, want ErrNotFound", err)
		}
		got, err := s.GetExportHold(ctx, "sha256:aa")
		if err != nil {
			t.Fatal(err)
		}
		if !got.AllowedAt.IsZero() || !got.FirstHeld.Equal(at(0)) || got.Nodes != 2 || got.Bans != 1 || got.Detail != h.Detail {
			t.Fatalf("held change %+v", got)
		}
		allowed, err := s.AllowExport(ctx, "sha256:aa", "owner", at(time.Minute), &store.AuditEvent{Time: at(time.Minute), Actor: "admin:owner", Action: "export.allow", Subject: "sha256:aa"})
		if err != nil {
			t.Fatalf("AllowExport: %v", err)
		}
		if !allowed.AllowedAt.Equal(at(time.Minute)) || allowed.AllowedBy != "owner" {
			t.Fatalf("allowed %+v", allowed)
		}
		ev, err := s.ListAudit(ctx, 1)
		if err != nil || len(ev) != 1 || ev[0].Action != "export.allow" {
			t.Fatalf("audit after allow: %+v, %v", ev, err)
		}
		// Held again (a later run): the allowance and first time stay.
		h.LastHeld, h.Nodes = at(2*time.Minute), 3
		if err := s.HoldExport(ctx, h, 3); err != nil {
			t.Fatal(err)
		}
		got, err = s.GetExportHold(ctx, "sha256:aa")
		if err != nil {
			t.Fatal(err)
		}
		if !got.AllowedAt.Equal(at(time.Minute)) || !got.FirstHeld.Equal(at(0)) || !got.LastHeld.Equal(at(2*time.Minute)) || got.Nodes != 3 {
			t.Fatalf("held again: %+v", got)
		}
		// The bound: the one held longest ago goes.
		for i := 1; i <= 3; i++ {
			if err := s.HoldExport(ctx, store.ExportHold{Digest: fmt.Sprintf("sha256:%02d", i), LastHeld: at(time.Duration(2+i) * time.Minute)}, 3); err != nil {
				t.Fatal(err)
			}
		}
		list, err := s.ListExportHolds(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 3 || list[0].Digest != "sha256:03" || list[2].Digest != "sha256:01" {
			t.Fatalf("holds after the bound: %+v", list)
		}
		if _, err := s.ListExportHolds(ctx, 0); err == nil {
			t.Fatal("ListExportHolds(0) did not fail")
		}
		if err := s.HoldExport(ctx, h, 0); err == nil {
			t.Fatal("HoldExport(max 0) did not fail")
		}
	}},
	{"delete join credentials removes a node's unused tokens and pending joins only", func(t *testing.T, s store.Store) {
		ctx := t.Context()
		for _, tk := range []struct{ id, node string }{{"t-a1", "node-a"}, {"t-a2", "node-a"}, {"t-b", "node-b"}, {"t-any", ""}} {
			tok := newToken(tk.id, at(0))
			tok.NodeID = tk.node
			if err := s.CreateToken(ctx, tok); err != nil {
				t.Fatal(err)
			}
		}
		mustCreatePending(t, s, newPending("p-a", "node-a", "t-a2", at(0)))
		mustCreatePending(t, s, newPending("p-b", "node-b", "t-b", at(0)))
		tokens, pending, err := s.DeleteJoinCredentials(ctx, "node-a", &store.AuditEvent{Time: at(time.Minute), Actor: "admin:owner", Action: "node.join-credentials.delete", Subject: "node-a"})
		if err != nil {
			t.Fatalf("DeleteJoinCredentials: %v", err)
		}
		if tokens != 2 || pending != 1 {
			t.Fatalf("deleted %d tokens and %d pending joins, want 2 and 1", tokens, pending)
		}
		for _, id := range []string{"t-a1", "t-a2"} {
			if _, err := s.TokenByHash(ctx, hashOf(id)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("token %s after deletion: %v, want ErrNotFound", id, err)
			}
		}
		for _, id := range []string{"t-b", "t-any"} {
			if _, err := s.TokenByHash(ctx, hashOf(id)); err != nil {
				t.Fatalf("token %s of another node was touched: %v", id, err)
			}
		}
		if _, err := s.GetPending(ctx, "p-a"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("pending p-a after deletion: %v", err)
		}
		if _, err := s.GetPending(ctx, "p-b"); err != nil {
			t.Fatalf("pending p-b of another node: %v", err)
		}
		ev, err := s.ListAudit(ctx, 1)
		if err != nil || len(ev) != 1 || ev[0].Action != "node.join-credentials.delete" {
			t.Fatalf("audit: %+v, %v", ev, err)
		}
		if tokens, pending, err = s.DeleteJoinCredentials(ctx, "node-a", nil); err != nil || tokens != 0 || pending != 0 {
			t.Fatalf("second deletion: %d, %d, %v", tokens, pending, err)
		}
	}},
}
