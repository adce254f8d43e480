package tpmhelper

import "testing"

// The swtpm tests run the test bodies of common_test.go on a freshly
// provisioned swtpm (EK certificates from a local CA) over TCP: a TPM with
// no resource manager and three object slots, where a leaked handle shows.
// They are skipped when swtpm is not installed, except under CI.

func TestSwtpmRoundTrip(t *testing.T) {
	t.Parallel()
	testRoundTrip(t, openSwtpm(t))
}

func TestSwtpmLRU(t *testing.T) {
	t.Parallel()
	testLRU(t, openSwtpm(t))
}

func TestSwtpmHelperRestart(t *testing.T) {
	t.Parallel()
	testHelperRestart(t, openSwtpm(t))
}

func TestSwtpmLyingHelper(t *testing.T) {
	t.Parallel()
	testLyingHelper(t, openSwtpm(t))
}

func TestSwtpmTimeout(t *testing.T) {
	t.Parallel()
	testTimeout(t, openSwtpm(t))
}
