package tpmhelper

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/tpm"
)

// DefaultTimeout bounds each call when [Config].Timeout is 0.
const DefaultTimeout = 30 * time.Second

// DefaultMaxLoaded is the number of keys the helper keeps loaded when
// [Config].MaxLoaded is 0: swtpm's three object slots hold two keys and the
// one transient object a call may load (the EK).
const DefaultMaxLoaded = 2

// maxRecords is the number of key records the helper remembers; the least
// recently used is forgotten beyond it (the node sends its record again).
const maxRecords = 16

// Log attribute keys.
const (
	logPeerUID = "peer_uid"
	logPeerPID = "peer_pid"
	logCode    = "code"
)

// Config configures [Serve].
type Config struct {
	// AllowedUID is the uid of the [helper] user: the only caller besides
	// root (uid 0) the helper serves.
	AllowedUID uint32
	// Timeout bounds each call, from its request to its answer, waiting
	// for the TPM included. 0 means DefaultTimeout (30 seconds).
	Timeout time.Duration
	// MaxLoaded is the number of keys kept loaded in the TPM between calls;
	// a call may load one transient object (the EK) on top. 0 means
	// DefaultMaxLoaded; less than 2 is 2, since a certification needs the
	// AK and the key at once.
	MaxLoaded int
	// Logger receives refused callers and failed calls; nil discards.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxLoaded == 0 {
		c.MaxLoaded = DefaultMaxLoaded
	}
	c.MaxLoaded = max(c.MaxLoaded, 2)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// hooks let tests reach into a call. Production passes none.
type hooks struct {
	// before runs in the call, holding the TPM, before the operation.
	before func(ctx context.Context, op string)
	// alter runs after a successful operation, holding the TPM, and may
	// change its answer.
	alter func(ctx context.Context, s *server, req *request, resp *response)
}

// Serve serves the TPM helper's operations (see the package documentation)
// on ln with t until ctx is done, then closes ln and every connection, waits
// for the operations in flight, flushes the keys it loaded and returns nil.
// It returns an error when accepting fails for another reason. t stays open:
// it is the caller's.
//
// Each connection's peer credentials are read when it is accepted: callers
// other than cfg.AllowedUID and root are refused and disconnected.
func Serve(ctx context.Context, ln *net.UnixListener, t *tpm.TPM, cfg Config) error {
	return serve(ctx, ln, t, cfg, hooks{})
}

func serve(ctx context.Context, ln *net.UnixListener, t *tpm.TPM, cfg Config, h hooks) error {
	if t == nil {
		return errors.New("tpmhelper: Serve needs a TPM")
	}
	s := &server{
		t:       t,
		cfg:     cfg.withDefaults(),
		hooks:   h,
		lock:    make(chan struct{}, 1),
		entries: map[string]*entry{},
		eks:     map[tpm.EKKind]*tpm.EK{},
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()

	var (
		conns  sync.WaitGroup
		mu     sync.Mutex
		open   = map[*net.UnixConn]struct{}{}
		result error
	)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				if ctx.Err() == nil {
					result = fmt.Errorf("tpmhelper: the listener was closed: %w", err)
				}
				break
			}
			// Out of file descriptors, say: wait a moment, as net/http does.
			s.cfg.Logger.WarnContext(ctx, "accept on the helper socket", logkey.Error, err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		mu.Lock()
		open[c] = struct{}{}
		mu.Unlock()
		conns.Go(func() {
			s.serveConn(ctx, c)
			mu.Lock()
			delete(open, c)
			mu.Unlock()
		})
	}
	cancel()
	_ = ln.Close()
	mu.Lock()
	for c := range open {
		_ = c.Close()
	}
	mu.Unlock()
	conns.Wait()
	s.ops.Wait()
	if err := s.flushAll(); err != nil {
		result = errors.Join(result, err)
	}
	return result
}

// server is one Serve's state.
type server struct {
	t     *tpm.TPM
	cfg   Config
	hooks hooks

	// lock is held by the operation using the TPM, the entries and eks.
	// It is a channel so that waiting for it honours the call's deadline.
	lock    chan struct{}
	entries map[string]*entry // by unique
	tick    uint64            // the last entry.used
	eks     map[tpm.EKKind]*tpm.EK

	// ops counts the operations in flight; one may outlive its call's
	// answer when the call timed out.
	ops sync.WaitGroup
}

// entry is a key the helper was asked for: its record, and the key while
// loaded.
type entry struct {
	rec  tpm.KeyRecord // names the key once derived
	key  *tpm.Key      // a loaded node key
	ak   *tpm.AK       // a loaded AK
	used uint64
}

func (e *entry) loaded() bool { return e.key != nil || e.ak != nil }

func (e *entry) publicArea() []byte {
	switch {
	case e.key != nil:
		return e.key.PublicArea()
	case e.ak != nil:
		return e.ak.PublicArea()
	}
	return nil
}

// unload flushes the key, if loaded.
func (e *entry) unload() error {
	var err error
	if e.key != nil {
		err = e.key.Close()
	}
	if e.ak != nil {
		err = e.ak.Close()
	}
	e.key, e.ak = nil, nil
	return err
}

// callError is a failure with its wire code.
type callError struct {
	code string
	err  error
}

func (e *callError) Error() string { return e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

func badRequest(format string, a ...any) error {
	return &callError{codeBadRequest, fmt.Errorf(format, a...)}
}

// serveConn checks the peer, greets it and answers its calls in order.
func (s *server) serveConn(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	log := s.cfg.Logger
	uid, pid, err := peerCred(c)
	if err == nil && uid != 0 && uid != s.cfg.AllowedUID {
		err = fmt.Errorf("uid %d may not use the TPM helper; only the [helper] user (uid %d) and root may: run bcd node as the [helper] user", uid, s.cfg.AllowedUID)
	}
	if err != nil {
		log.WarnContext(ctx, "refused a caller", logPeerUID, uid, logPeerPID, pid, logkey.Error, err)
		_ = c.SetWriteDeadline(time.Now().Add(s.cfg.Timeout))
		_ = writeFrame(c, greeting{Version: protocolVersion, Code: codeDenied, Error: "bcd helper: " + err.Error()})
		return
	}
	log = log.With(logPeerUID, uid, logPeerPID, pid)
	_ = c.SetWriteDeadline(time.Now().Add(s.cfg.Timeout))
	if err := writeFrame(c, greeting{Version: protocolVersion}); err != nil {
		return
	}
	for {
		var req request
		if err := readFrame(c, maxRequestFrame, &req); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || ctx.Err() != nil {
				return
			}
			log.InfoContext(ctx, "unreadable request", logkey.Error, err)
			_ = c.SetWriteDeadline(time.Now().Add(s.cfg.Timeout))
			_ = writeFrame(c, &response{Code: codeBadRequest, Error: fmt.Sprintf("bcd helper: unreadable request: %v", err)})
			return
		}
		resp := s.handle(ctx, log, &req)
		_ = c.SetWriteDeadline(time.Now().Add(s.cfg.Timeout))
		if err := writeFrame(c, resp); err != nil {
			return
		}
	}
}

// handle runs one call with the timeout. The operation runs on its own
// goroutine, so that the caller gets an answer in time even while a TPM
// command hangs; it then finishes (its context cancelled) in the
// background, holding the TPM until it does.
func (s *server) handle(ctx context.Context, log *slog.Logger, req *request) *response {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	done := make(chan *response, 1)
	s.ops.Go(func() { done <- s.run(ctx, req) })
	var resp *response
	select {
	case resp = <-done:
	case <-ctx.Done():
		resp = s.ctxFailure(ctx)
	}
	if resp.Code != "" {
		log.InfoContext(ctx, "call failed", logkey.Op, req.Op, logCode, resp.Code, logkey.Error, resp.Error)
	} else {
		log.DebugContext(ctx, "call", logkey.Op, req.Op)
	}
	return resp
}

// ctxFailure is the answer to a call whose context is done.
func (s *server) ctxFailure(ctx context.Context) *response {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &response{Code: codeTimeout, Error: fmt.Sprintf("bcd helper: the call took longer than %s", s.cfg.Timeout)}
	}
	return &response{Code: codeUnavailable, Error: "bcd helper: shutting down"}
}

// run takes the TPM and runs the operation.
func (s *server) run(ctx context.Context, req *request) *response {
	select {
	case s.lock <- struct{}{}:
	case <-ctx.Done():
		return s.ctxFailure(ctx)
	}
	defer func() { <-s.lock }()
	if s.hooks.before != nil {
		s.hooks.before(ctx, req.Op)
	}
	resp, err := s.do(ctx, req)
	if err != nil {
		return s.failure(ctx, err)
	}
	if s.hooks.alter != nil {
		s.hooks.alter(ctx, s, req, resp)
	}
	return resp
}

// failure maps err to its wire code.
func (s *server) failure(ctx context.Context, err error) *response {
	var ce *callError
	code := codeTPM
	switch {
	case errors.As(err, &ce):
		code = ce.code
	case errors.Is(err, tpm.ErrKeyChanged):
		code = codeKeyChanged
	case errors.Is(err, tpm.ErrEKChanged):
		code = codeEKChanged
	case ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return s.ctxFailure(ctx)
	}
	return &response{Code: code, Error: "bcd helper: " + err.Error()}
}

func (s *server) do(ctx context.Context, req *request) (*response, error) {
	switch req.Op {
	case opNodeKey:
		return s.derive(ctx, req, tpm.KindNodeKey)
	case opAK:
		return s.derive(ctx, req, tpm.KindAK)
	case opSign:
		return s.sign(ctx, req)
	case opCertify:
		return s.certify(ctx, req)
	case opRelease:
		return s.release(req)
	case opEK:
		return s.ek(ctx, req)
	case opActivate:
		return s.activate(ctx, req)
	case opQuote:
		return s.quote(ctx, req)
	default:
		return nil, badRequest("unknown operation %q", req.Op)
	}
}

// derive answers tpm.nodekey and tpm.ak.
func (s *server) derive(ctx context.Context, req *request, kind tpm.KeyKind) (*response, error) {
	var e *entry
	if len(req.Record) == 0 {
		if err := s.makeRoom(nil); err != nil {
			return nil, err
		}
		e = &entry{}
		switch kind {
		case tpm.KindNodeKey:
			k, rec, err := s.t.NewNodeKey(ctx)
			if err != nil {
				return nil, err
			}
			e.key, e.rec = k, rec
		case tpm.KindAK:
			k, rec, err := s.t.NewAK(ctx)
			if err != nil {
				return nil, err
			}
			e.ak, e.rec = k, rec
		}
		s.add(e)
	} else {
		rec, err := tpm.ParseKeyRecord(req.Record)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		if rec.Kind != kind {
			return nil, badRequest("%s with the record of a %s", req.Op, rec.Kind)
		}
		if e, err = s.register(ctx, rec); err != nil {
			return nil, err
		}
	}
	pem, err := tpm.MarshalKeyRecord(e.rec)
	if err != nil {
		return nil, err
	}
	return &response{Record: pem, PublicArea: e.publicArea(), Name: bytes.Clone(e.rec.Name)}, nil
}

// register returns the loaded entry of rec, deriving it when needed.
func (s *server) register(ctx context.Context, rec tpm.KeyRecord) (*entry, error) {
	if e, ok := s.entries[string(rec.Unique())]; ok {
		if e.rec.Kind != rec.Kind || e.rec.Hierarchy != rec.Hierarchy || !bytes.Equal(e.rec.Template, rec.Template) {
			return nil, badRequest("the helper holds a key of unique %x with another record", rec.Unique())
		}
		if len(rec.Name) != 0 && !bytes.Equal(rec.Name, e.rec.Name) {
			return nil, fmt.Errorf("the record names %x, the TPM derived %x: %w", rec.Name, e.rec.Name, tpm.ErrKeyChanged)
		}
		return e, s.ensureLoaded(ctx, e)
	}
	e := &entry{rec: rec}
	if err := s.ensureLoaded(ctx, e); err != nil {
		return nil, err
	}
	s.add(e)
	return e, nil
}

// add remembers e, forgetting the least recently used other key beyond
// maxRecords.
func (s *server) add(e *entry) {
	s.touch(e)
	s.entries[string(e.rec.Unique())] = e
	for len(s.entries) > maxRecords {
		var lru *entry
		for _, o := range s.entries {
			if o != e && (lru == nil || o.used < lru.used) {
				lru = o
			}
		}
		delete(s.entries, string(lru.rec.Unique()))
		if err := lru.unload(); err != nil {
			s.cfg.Logger.Warn("flush a forgotten key", logkey.Error, err)
		}
	}
}

func (s *server) touch(e *entry) {
	s.tick++
	e.used = s.tick
}

// ensureLoaded loads e when it is not, making room first without unloading
// keep.
func (s *server) ensureLoaded(ctx context.Context, e *entry, keep ...*entry) error {
	if !e.loaded() {
		if err := s.makeRoom(append(keep, e)); err != nil {
			return err
		}
		switch e.rec.Kind {
		case tpm.KindNodeKey:
			k, err := s.t.LoadNodeKey(ctx, e.rec)
			if err != nil {
				return err
			}
			e.key, e.rec = k, k.Record()
		case tpm.KindAK:
			k, err := s.t.LoadAK(ctx, e.rec)
			if err != nil {
				return err
			}
			e.ak, e.rec = k, k.Record()
		default:
			return badRequest("a record of kind %s", e.rec.Kind)
		}
	}
	s.touch(e)
	return nil
}

// makeRoom flushes the least recently used loaded keys, but not keep, until
// one more key fits under MaxLoaded.
func (s *server) makeRoom(keep []*entry) error {
	for {
		n := 0
		var lru *entry
		for _, e := range s.entries {
			if !e.loaded() {
				continue
			}
			n++
			if !containsEntry(keep, e) && (lru == nil || e.used < lru.used) {
				lru = e
			}
		}
		if n < s.cfg.MaxLoaded {
			return nil
		}
		if lru == nil {
			return fmt.Errorf("more than %d keys needed at once", s.cfg.MaxLoaded)
		}
		if err := lru.unload(); err != nil {
			return err
		}
	}
}

func containsEntry(list []*entry, e *entry) bool {
	for _, o := range list {
		if o == e {
			return true
		}
	}
	return false
}

// lookup returns the entry of unique, which must be of kind.
func (s *server) lookup(unique []byte, kind tpm.KeyKind) (*entry, error) {
	if len(unique) != tpm.UniqueSize {
		return nil, badRequest("a key unique of %d bytes, want %d", len(unique), tpm.UniqueSize)
	}
	e, ok := s.entries[string(unique)]
	if !ok {
		return nil, &callError{codeUnknownKey, fmt.Errorf("the helper holds no key of unique %x; send its record again", unique)}
	}
	if e.rec.Kind != kind {
		return nil, badRequest("the key of unique %x is a %s, not a %s", unique, e.rec.Kind, kind)
	}
	return e, nil
}

func (s *server) sign(ctx context.Context, req *request) (*response, error) {
	if len(req.Digest) != sha256.Size {
		return nil, badRequest("a digest of %d bytes, want a SHA-256 digest", len(req.Digest))
	}
	e, err := s.lookup(req.Unique, tpm.KindNodeKey)
	if err != nil {
		return nil, err
	}
	if err := s.ensureLoaded(ctx, e); err != nil {
		return nil, err
	}
	sig, err := e.key.SignContext(ctx, req.Digest)
	if err != nil {
		return nil, err
	}
	return &response{Signature: sig}, nil
}

func (s *server) certify(ctx context.Context, req *request) (*response, error) {
	if len(req.QualifyingData) > maxQualifyingData {
		return nil, badRequest("qualifying data of %d bytes, want at most %d", len(req.QualifyingData), maxQualifyingData)
	}
	ak, err := s.lookup(req.AK, tpm.KindAK)
	if err != nil {
		return nil, err
	}
	key, err := s.lookup(req.Unique, tpm.KindNodeKey)
	if err != nil {
		return nil, err
	}
	if err := s.ensureLoaded(ctx, ak); err != nil {
		return nil, err
	}
	if err := s.ensureLoaded(ctx, key, ak); err != nil {
		return nil, err
	}
	attest, sig, err := s.t.Certify(ctx, ak.ak, key.key, req.QualifyingData)
	if err != nil {
		return nil, err
	}
	return &response{Attest: attest, Signature: sig}, nil
}

func (s *server) release(req *request) (*response, error) {
	if len(req.Unique) != tpm.UniqueSize {
		return nil, badRequest("a key unique of %d bytes, want %d", len(req.Unique), tpm.UniqueSize)
	}
	e, ok := s.entries[string(req.Unique)]
	if !ok {
		return &response{}, nil
	}
	delete(s.entries, string(req.Unique))
	if err := e.unload(); err != nil {
		return nil, err
	}
	return &response{}, nil
}

func (s *server) ek(ctx context.Context, req *request) (*response, error) {
	var kind tpm.EKKind
	if req.EKKind != "" {
		var err error
		if kind, err = parseEKKind(req.EKKind); err != nil {
			return nil, badRequest("%v", err)
		}
	}
	certs, err := s.t.EKCertificates(ctx)
	if err != nil {
		return nil, err
	}
	resp := &response{Certificates: certs}
	if req.EKKind == "" {
		return resp, nil
	}
	ek, err := s.t.EK(ctx, kind)
	if err != nil {
		return nil, err
	}
	s.eks[ek.Kind] = ek
	if resp.EKKind, err = ekKindName(ek.Kind); err != nil {
		return nil, err
	}
	resp.PublicArea = ek.PublicArea
	return resp, nil
}

func (s *server) activate(ctx context.Context, req *request) (*response, error) {
	kind, err := parseEKKind(req.EKKind)
	if err != nil || kind == tpm.EKAuto {
		return nil, badRequest("tpm.activate needs the EK's kind: one of %s but auto", ekKindList)
	}
	if len(req.EKName) == 0 {
		return nil, badRequest("tpm.activate needs the EK's name")
	}
	if n, m := len(req.CredentialBlob), len(req.EncryptedSec); n == 0 || m == 0 || n > maxCredential || m > maxCredential {
		return nil, badRequest("a credential blob of %d and a secret of %d bytes, want 1 to %d each", n, m, maxCredential)
	}
	ak, err := s.lookup(req.AK, tpm.KindAK)
	if err != nil {
		return nil, err
	}
	ek := s.eks[kind]
	if ek == nil || !bytes.Equal(ek.Name, req.EKName) {
		if ek, err = s.t.EK(ctx, kind); err != nil {
			return nil, err
		}
		s.eks[kind] = ek
		if !bytes.Equal(ek.Name, req.EKName) {
			return nil, fmt.Errorf("the TPM derives the %s EK %x, the call names %x: %w", kind, ek.Name, req.EKName, tpm.ErrEKChanged)
		}
	}
	if err := s.ensureLoaded(ctx, ak); err != nil {
		return nil, err
	}
	secret, err := s.t.ActivateCredential(ctx, ak.ak, ek, req.CredentialBlob, req.EncryptedSec)
	if err != nil {
		return nil, err
	}
	return &response{Secret: secret}, nil
}

func (s *server) quote(ctx context.Context, req *request) (*response, error) {
	if len(req.Nonce) > maxQualifyingData {
		return nil, badRequest("a nonce of %d bytes, want at most %d", len(req.Nonce), maxQualifyingData)
	}
	if err := checkPCRs(req.PCRs); err != nil {
		return nil, badRequest("%v", err)
	}
	ak, err := s.lookup(req.AK, tpm.KindAK)
	if err != nil {
		return nil, err
	}
	if err := s.ensureLoaded(ctx, ak); err != nil {
		return nil, err
	}
	quoted, sig, values, err := s.t.Quote(ctx, ak.ak, req.Nonce, req.PCRs)
	if err != nil {
		return nil, err
	}
	return &response{Quoted: quoted, Signature: sig, PCRValues: values}, nil
}

// checkPCRs checks a selection of the SHA-256 bank: 1 to 24 distinct PCRs
// of 0–23.
func checkPCRs(pcrs []int) error {
	if len(pcrs) == 0 || len(pcrs) > 24 {
		return fmt.Errorf("%d PCRs selected, want 1 to 24", len(pcrs))
	}
	var seen [24]bool
	for _, p := range pcrs {
		if p < 0 || p > 23 {
			return fmt.Errorf("PCR %d: want 0 to 23", p)
		}
		if seen[p] {
			return fmt.Errorf("PCR %d selected twice", p)
		}
		seen[p] = true
	}
	return nil
}

// flushAll flushes every key, once the operations in flight are done.
func (s *server) flushAll() error {
	s.lock <- struct{}{}
	defer func() { <-s.lock }()
	var errs []error
	for u, e := range s.entries {
		if err := e.unload(); err != nil {
			errs = append(errs, err)
		}
		delete(s.entries, u)
	}
	return errors.Join(errs...)
}
