package tpm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/tcp"
)

// DefaultDevice is the kernel's TPM resource manager, which "auto" opens.
const DefaultDevice = "/dev/tpmrm0"

var (
	// ErrNoTPM is returned by [Open] for "off", and for "auto" on a host
	// without DefaultDevice. Callers fall back to a file key.
	ErrNoTPM = errors.New("no TPM")
	// ErrClosed is returned by every method of a [TPM] after its Close, and
	// of a [Key] or [AK] after its own Close.
	ErrClosed = errors.New("tpm: closed")
	// ErrUnsupported is returned by [Open] for a device path on an operating
	// system without a device transport.
	ErrUnsupported = errors.New("tpm: unsupported on this operating system")
	// ErrKeyChanged is returned when a TPM derives, from a stored record,
	// another key than the one the record was made with. For the owner
	// hierarchy this means the TPM was cleared (TPM2_Clear, Part 3,
	// section 24.6) or it is another TPM.
	ErrKeyChanged = errors.New("the TPM derives another key from this record (was the TPM cleared?)")
	// ErrEKChanged is returned by [TPM.ActivateCredential] when the TPM
	// derives another EK than the [EK] passed in.
	ErrEKChanged = errors.New("the TPM derives another EK than the one given")
)

// TPM is one open TPM. Its methods are safe for concurrent use: they are
// serialized by a mutex, and each checks its context before each TPM command
// it sends.
type TPM struct {
	mu     sync.Mutex
	tr     transport.TPM
	closer io.Closer
	closed bool
	// loaded holds the keys that are still loaded, so Close can flush them on
	// a TPM without a resource manager.
	loaded map[*object]struct{}
	// nvMax caches TPM_PT_NV_BUFFER_MAX.
	nvMax int
}

// New returns a TPM that sends commands on t. closer, if not nil, is closed by
// [TPM.Close]. Tests pass the simulator (package tpmsim) here.
func New(t transport.TPM, closer io.Closer) *TPM {
	return &TPM{tr: t, closer: closer, loaded: map[*object]struct{}{}}
}

// Open opens the TPM that spec names, as the tpm setting of config.toml
// does:
//
//   - "auto" (or ""): DefaultDevice when it exists, else [ErrNoTPM].
//   - "off": [ErrNoTPM].
//   - an absolute device path such as "/dev/tpmrm0" or "/dev/tpm0".
//   - "tcp://host:port": a TPM over TCP such as swtpm, with the command port
//     at port and the platform (control) port at port+1. Open does not send
//     the simulator's PowerOn: swtpm started with --flags
//     not-need-init,startup-clear is already on and started. Such a TPM has
//     no resource manager and serves one connection at a time.
//
// The in-process simulator is not opened here; see package tpmsim.
func Open(spec string) (*TPM, error) {
	switch {
	case spec == "" || spec == "auto":
		if _, err := os.Stat(DefaultDevice); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w: %s does not exist", ErrNoTPM, DefaultDevice)
			}
			return nil, fmt.Errorf("open TPM %s: %w", DefaultDevice, err)
		}
		return openDevice(DefaultDevice)
	case spec == "off":
		return nil, fmt.Errorf("%w: tpm = \"off\"", ErrNoTPM)
	case strings.HasPrefix(spec, "tcp://"):
		return openTCP(spec)
	case strings.HasPrefix(spec, "/"):
		return openDevice(spec)
	default:
		return nil, fmt.Errorf("tpm %q: want \"auto\", \"off\", a device path such as /dev/tpmrm0, or tcp://host:port", spec)
	}
}

func openTCP(spec string) (*TPM, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("tpm %q: %w", spec, err)
	}
	host, portStr, err := net.SplitHostPort(u.Host)
	if err != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("tpm %q: want tcp://host:port", spec)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65534 {
		return nil, fmt.Errorf("tpm %q: the port must be 1..65534 (port+1 is the platform port)", spec)
	}
	t, err := tcp.Open(tcp.Config{
		CommandAddress:  net.JoinHostPort(host, strconv.Itoa(port)),
		PlatformAddress: net.JoinHostPort(host, strconv.Itoa(port+1)),
	})
	if err != nil {
		return nil, fmt.Errorf("open TPM at %s: %w", spec, err)
	}
	return New(t, t), nil
}

// Close flushes the keys that are still loaded and closes the transport.
// Keys of this TPM cannot be used afterwards.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	var errs []error
	for o := range t.loaded {
		errs = append(errs, t.flushObject(o))
	}
	t.closed = true
	if t.closer != nil {
		if err := t.closer.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close TPM transport: %w", err))
		}
	}
	return errors.Join(errs...)
}

// begin locks the TPM and returns a transport that checks ctx before each
// command. The caller must call t.mu.Unlock.
func (t *TPM) begin(ctx context.Context) (transport.TPM, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		t.mu.Unlock()
		return nil, err
	}
	return ctxTransport{ctx: ctx, tpm: t.tr}, nil
}

// ctxTransport refuses to send a command once its context is done, and
// resends a command the TPM did not start (see sendRetry).
type ctxTransport struct {
	ctx context.Context
	tpm transport.TPM
}

func (c ctxTransport) Send(cmd []byte) ([]byte, error) {
	return sendRetry(c.ctx, c.tpm, cmd)
}

// The warnings of Part 2, section 6.6.3 after which a command may simply be
// sent again: TPM_RC_RETRY ("the TPM was not able to start the command";
// libtpms answers it to the first use of a DA-protected object after a
// start, to save its lockout state), TPM_RC_YIELDED and TPM_RC_TESTING.
const (
	rcRetry   = 0x922
	rcYielded = 0x908
	rcTesting = 0x90A
)

// retryDelays are the pauses before each resend: about 1.5 s in all.
var retryDelays = []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond}

// sendRetry sends cmd, checking ctx before each attempt, and sends it again
// while the TPM answers one of the warnings above. The TPM did not execute
// the command then, so sessions are unchanged and the same bytes are valid.
func sendRetry(ctx context.Context, tr transport.TPM, cmd []byte) ([]byte, error) {
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rsp, err := tr.Send(cmd)
		if err != nil || i == len(retryDelays) || len(rsp) < 10 {
			return rsp, err
		}
		switch binary.BigEndian.Uint32(rsp[6:10]) {
		case rcRetry, rcYielded, rcTesting:
		default:
			return rsp, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(retryDelays[i]):
		}
	}
}

// rawTransport is the TPM's transport for cleanup: it resends like
// ctxTransport but ignores any context, so a flush runs even when the
// operation was cancelled.
type rawTransport struct{ tpm transport.TPM }

func (r rawTransport) Send(cmd []byte) ([]byte, error) {
	return sendRetry(context.Background(), r.tpm, cmd)
}

// flush unloads a transient object or session with TPM2_FlushContext
// (Part 3, section 28.4). It does not look at any context: cleanup runs even
// when the operation was cancelled.
func (t *TPM) flush(h tpm2.TPMHandle, what string) error {
	if _, err := (tpm2.FlushContext{FlushHandle: h}).Execute(rawTransport{t.tr}); err != nil {
		return fmt.Errorf("TPM2_FlushContext for %s (handle %#x): %w", what, uint32(h), err)
	}
	return nil
}

// loadedObject is what TPM2_CreatePrimary returned.
type loadedObject struct {
	handle     tpm2.TPMHandle
	name       []byte
	publicArea []byte
}

// createPrimary runs TPM2_CreatePrimary (Part 3, section 24.1) under
// hierarchy with template and an empty authValue. On success the caller owns
// the returned transient object and must flush it.
func (t *TPM) createPrimary(tr transport.TPM, hierarchy tpm2.TPMHandle, template []byte, what string) (*loadedObject, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: hierarchy, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.BytesAs2B[tpm2.TPMTPublic](template),
	}.Execute(tr)
	if err != nil {
		return nil, fmt.Errorf("TPM2_CreatePrimary for %s: %w", what, err)
	}
	return &loadedObject{
		handle:     rsp.ObjectHandle,
		name:       append([]byte(nil), rsp.Name.Buffer...),
		publicArea: append([]byte(nil), rsp.OutPublic.Bytes()...),
	}, nil
}
