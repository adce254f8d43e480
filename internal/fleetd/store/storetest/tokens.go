package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

var tokenCases = []testCase{
	{"a created token reads back by its hash", func(t *testing.T, s store.Store) {
		tok := newToken("tok1", at(0))
		tok.NodeID = "node-1"
		tok.AllowReclaim = true
		tok.RequireApproval = true
		mustCreateToken(t, s, tok)
		wantEqual(t, "TokenByHash", normToken, mustGetToken(t, s, "tok1"), tok)
	}},
	{"a used token reads back with its use", func(t *testing.T, s store.Store) {
		tok := newToken("tok1", at(0))
		tok.UsedAt, tok.UsedBy = at(time.Minute), "node-1"
		mustCreateToken(t, s, tok)
		wantEqual(t, "TokenByHash", normToken, mustGetToken(t, s, "tok1"), tok)
	}},
	{"creating a token whose id exists is a conflict", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		dup := newToken("tok1", at(time.Minute))
		dup.Hash = hashOf("other")
		wantErr(t, "CreateToken(same id)", s.CreateToken(t.Context(), dup), store.ErrConflict)
		if _, err := s.TokenByHash(t.Context(), dup.Hash); err == nil {
			t.Error("the refused token was stored")
		}
		wantEqual(t, "first token", normToken, mustGetToken(t, s, "tok1"), newToken("tok1", at(0)))
	}},
	{"creating a token whose hash exists is a conflict", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		dup := newToken("tok2", at(time.Minute))
		dup.Hash = hashOf("tok1")
		wantErr(t, "CreateToken(same hash)", s.CreateToken(t.Context(), dup), store.ErrConflict)
		wantEqual(t, "first token", normToken, mustGetToken(t, s, "tok1"), newToken("tok1", at(0)))
	}},
	{"an unknown token hash is not found", func(t *testing.T, s store.Store) {
		mustCreateToken(t, s, newToken("tok1", at(0)))
		_, err := s.TokenByHash(t.Context(), hashOf("nope"))
		wantErr(t, "TokenByHash(unknown)", err, store.ErrNotFound)
	}},
	{"tokens list newest first", func(t *testing.T, s store.Store) {
		ts, err := s.ListTokens(t.Context())
		if err != nil || len(ts) != 0 {
			t.Fatalf("ListTokens on an empty store = %v, %v; want none", ts, err)
		}
		// Created out of order, so that insertion order is not the answer.
		for _, tok := range []store.Token{
			newToken("b", at(2*time.Minute)),
			newToken("d", at(4*time.Minute)),
			newToken("a", at(1*time.Minute)),
			newToken("c", at(3*time.Minute)),
		} {
			mustCreateToken(t, s, tok)
		}
		ts, err = s.ListTokens(t.Context())
		if err != nil {
			t.Fatalf("ListTokens: %v", err)
		}
		var got []string
		for _, tok := range ts {
			got = append(got, tok.ID)
		}
		if want := []string{"d", "c", "b", "a"}; !slices.Equal(got, want) {
			t.Fatalf("ListTokens ids %q, want %q", got, want)
		}
		wantEqual(t, "ListTokens()[0]", normToken, ts[0], newToken("d", at(4*time.Minute)))
	}},
}
