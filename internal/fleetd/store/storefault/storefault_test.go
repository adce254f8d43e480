package storefault_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
)

// open wraps a new SQLite store in t.TempDir().
func open(t *testing.T) *storefault.Store {
	t.Helper()
	db, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "fleetd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return storefault.New(db)
}

func token(name string) store.Token {
	h := sha256.Sum256([]byte(name))
	now := time.Now().UTC().Truncate(time.Microsecond)
	return store.Token{ID: name, Hash: h[:], Role: "worker", CreatedBy: "test", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
}

func stored(t *testing.T, s store.Store, name string) bool {
	t.Helper()
	_, err := s.TokenByHash(t.Context(), token(name).Hash)
	switch {
	case err == nil:
		return true
	case errors.Is(err, store.ErrNotFound):
		return false
	}
	t.Fatalf("TokenByHash(%s): %v", name, err)
	return false
}

func TestFailAt(t *testing.T) {
	cases := []struct {
		name string
		// arm is called after the first CreateToken ("t1").
		arm func(f *storefault.Store)
		// want says which of t2, t3, t4 reach the store.
		want   map[string]bool
		wantIs error
	}{
		{
			name:   "the second call from now fails and the calls around it reach the store",
			arm:    func(f *storefault.Store) { f.FailAt("CreateToken", 2, storefault.ErrInjected) },
			want:   map[string]bool{"t2": true, "t3": false, "t4": true},
			wantIs: storefault.ErrInjected,
		},
		{
			name:   "the next call fails with a store sentinel as given",
			arm:    func(f *storefault.Store) { f.FailNext("CreateToken", store.ErrConflict) },
			want:   map[string]bool{"t2": false, "t3": true, "t4": true},
			wantIs: store.ErrConflict,
		},
		{
			name: "two armed calls of one method both fail",
			arm: func(f *storefault.Store) {
				f.FailAt("CreateToken", 1, storefault.ErrInjected)
				f.FailAt("CreateToken", 3, storefault.ErrInjected)
			},
			want:   map[string]bool{"t2": false, "t3": true, "t4": false},
			wantIs: storefault.ErrInjected,
		},
		{
			name:   "a fault armed for another method leaves these calls alone",
			arm:    func(f *storefault.Store) { f.FailNext("GetNode", storefault.ErrInjected) },
			want:   map[string]bool{"t2": true, "t3": true, "t4": true},
			wantIs: nil,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := open(t)
			ctx := t.Context()
			if err := f.CreateToken(ctx, token("t1")); err != nil {
				t.Fatal(err)
			}
			tc.arm(f)
			for _, name := range []string{"t2", "t3", "t4"} {
				err := f.CreateToken(ctx, token(name))
				if tc.want[name] && err != nil {
					t.Errorf("CreateToken(%s) = %v, want it to reach the store", name, err)
				}
				if !tc.want[name] && !errors.Is(err, tc.wantIs) {
					t.Errorf("CreateToken(%s) = %v, want %v", name, err, tc.wantIs)
				}
				if got := stored(t, f.Unwrap(), name); got != tc.want[name] {
					t.Errorf("token %s stored = %t, want %t", name, got, tc.want[name])
				}
			}
			if got := f.Calls("CreateToken"); got != 4 {
				t.Errorf("Calls(CreateToken) = %d, want 4 (failed calls count too)", got)
			}
		})
	}
}

func TestBefore(t *testing.T) {
	type key struct{}
	cases := []struct {
		name      string
		hookErr   error
		wantErr   error
		wantToken bool
	}{
		{name: "a hook that returns nil lets the call reach the store", hookErr: nil, wantErr: nil, wantToken: true},
		{name: "a hook that returns an error fails the call", hookErr: storefault.ErrInjected, wantErr: storefault.ErrInjected, wantToken: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := open(t)
			ctx := context.WithValue(t.Context(), key{}, "the caller's")
			var sawCtx any
			f.Before("CreateToken", 1, func(ctx context.Context) error {
				sawCtx = ctx.Value(key{})
				// The hook changes the store underneath: these writes
				// are not counted and never fail.
				if err := f.Unwrap().CreateToken(ctx, token("by-hook")); err != nil {
					t.Errorf("the hook's write: %v", err)
				}
				return tc.hookErr
			})
			err := f.CreateToken(ctx, token("by-caller"))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("CreateToken = %v, want %v", err, tc.wantErr)
			}
			if sawCtx != "the caller's" {
				t.Errorf("the hook saw context value %v, want the call's context", sawCtx)
			}
			if !stored(t, f, "by-hook") {
				t.Error("the hook's write is not in the store")
			}
			if got := stored(t, f, "by-caller"); got != tc.wantToken {
				t.Errorf("the caller's token stored = %t, want %t", got, tc.wantToken)
			}
			if got := f.Calls("CreateToken"); got != 1 {
				t.Errorf("Calls(CreateToken) = %d, want 1: the hook's own write goes around the counter", got)
			}
		})
	}
}

func TestUnfiredAndDisarm(t *testing.T) {
	f := open(t)
	ctx := t.Context()
	if _, err := f.ListNodes(ctx); err != nil {
		t.Fatal(err)
	}
	f.FailAt("ListNodes", 2, storefault.ErrInjected)
	f.FailNext("GetCert", storefault.ErrInjected)
	if got, want := f.Unfired(), []string{"GetCert#1", "ListNodes#3"}; !slices.Equal(got, want) {
		t.Fatalf("Unfired = %v, want %v", got, want)
	}
	if _, err := f.GetCert(ctx, "00"); !errors.Is(err, storefault.ErrInjected) {
		t.Fatalf("GetCert = %v, want the injected failure", err)
	}
	if got, want := f.Unfired(), []string{"ListNodes#3"}; !slices.Equal(got, want) {
		t.Fatalf("Unfired after GetCert = %v, want %v", got, want)
	}
	f.Disarm()
	if got := f.Unfired(); len(got) != 0 {
		t.Fatalf("Unfired after Disarm = %v, want none", got)
	}
	for i := range 3 {
		if _, err := f.ListNodes(ctx); err != nil {
			t.Errorf("ListNodes call %d after Disarm = %v, want it to reach the store", i+2, err)
		}
	}
}

func TestMisuse(t *testing.T) {
	f := open(t)
	cases := []struct {
		name string
		call func()
		want string
	}{
		{name: "a method store.Store does not have panics", call: func() { f.FailNext("GetToken", storefault.ErrInjected) }, want: `no method "GetToken"`},
		{name: "Calls of a method store.Store does not have panics", call: func() { f.Calls("Nodes") }, want: `no method "Nodes"`},
		{name: "call number zero panics", call: func() { f.FailAt("GetNode", 0, storefault.ErrInjected) }, want: "the next call is 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
					t.Fatalf("panic %v, want one containing %q", r, tc.want)
				}
			}()
			tc.call()
		})
	}
}

// TestEveryMethodCanFail calls each method of store.Store through the
// wrapper with a fault armed for it. A method the wrapper does not
// override is promoted from the wrapped store and ignores the fault: give
// it an override in storefault.go.
func TestEveryMethodCanFail(t *testing.T) {
	f := open(t)
	v := reflect.ValueOf(f)
	ctxType := reflect.TypeFor[context.Context]()
	st := reflect.TypeFor[store.Store]()
	for i := range st.NumMethod() {
		m := st.Method(i)
		t.Run(m.Name, func(t *testing.T) {
			f.FailNext(m.Name, storefault.ErrInjected)
			args := make([]reflect.Value, m.Type.NumIn())
			for j := range args {
				if in := m.Type.In(j); in == ctxType {
					args[j] = reflect.ValueOf(t.Context())
				} else {
					args[j] = reflect.Zero(in)
				}
			}
			out := v.MethodByName(m.Name).Call(args)
			err, _ := out[len(out)-1].Interface().(error)
			if !errors.Is(err, storefault.ErrInjected) {
				t.Errorf("%s = %v with a fault armed: storefault does not override it; add it to storefault.go", m.Name, err)
			}
			if got := f.Calls(m.Name); got != 1 {
				t.Errorf("Calls(%s) = %d, want 1", m.Name, got)
			}
		})
	}
}

func TestConcurrentCallsAreCountedOnce(t *testing.T) {
	f := open(t)
	const workers, each = 8, 25
	f.FailAt("ListTokens", 100, storefault.ErrInjected)
	var failed atomic.Int32
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				_, err := f.ListTokens(t.Context())
				switch {
				case errors.Is(err, storefault.ErrInjected):
					failed.Add(1)
				case err != nil:
					t.Errorf("ListTokens: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if got := f.Calls("ListTokens"); got != workers*each {
		t.Errorf("Calls(ListTokens) = %d, want %d", got, workers*each)
	}
	if got := failed.Load(); got != 1 {
		t.Errorf("%d calls failed, want exactly the 100th", got)
	}
}
