package tpmhelper

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// frame is b as one frame: its length, then b.
func frame(b []byte) []byte {
	out := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	return append(out, b...)
}

// FuzzReadFrame feeds the helper's frame decoder what a hostile peer on
// the socket may send, as a request (the helper's side) and as a response
// (the node's side): it must never panic, and what it decodes must
// survive a round trip through writeFrame.
func FuzzReadFrame(f *testing.F) {
	f.Add(frame([]byte(`{"op":"tpm.sign","unique":"AAEC","digest":"AAAA"}`)))
	f.Add(frame([]byte(`{"op":"tpm.quote","ak":"AQ==","nonce":"AQ==","pcrs":[0,1,7]}`)))
	f.Add(frame([]byte(`{"code":"denied","error":"no"}`)))
	f.Add(frame([]byte(`{"certificates":{"29360138":"AQID"},"pcr_values":{"7":"AA=="}}`)))
	f.Add(frame([]byte(`{"v":1}`)))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, '{'})
	f.Add(frame([]byte(`{"op":`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req request
		if err := readFrame(bytes.NewReader(data), maxRequestFrame, &req); err == nil {
			frameRoundTrip(t, &req, &request{}, maxRequestFrame)
		}
		var resp response
		if err := readFrame(bytes.NewReader(data), maxResponseFrame, &resp); err == nil {
			frameRoundTrip(t, &resp, &response{}, maxResponseFrame)
		}
		var g greeting
		_ = readFrame(bytes.NewReader(data), maxRequestFrame, &g)
	})
}

// frameRoundTrip writes v as a frame, reads it into fresh, and checks that
// writing fresh gives the same frame.
func frameRoundTrip(t *testing.T, v, fresh any, limit int) {
	t.Helper()
	var first, second bytes.Buffer
	if err := writeFrame(&first, v); err != nil {
		t.Fatalf("write a decoded frame: %v", err)
	}
	if first.Len()-4 > limit {
		return // re-encoding can grow (base64 of bytes decoded from escapes)
	}
	if err := readFrame(bytes.NewReader(first.Bytes()), limit, fresh); err != nil {
		t.Fatalf("read back a frame the decoder wrote: %v", err)
	}
	if err := writeFrame(&second, fresh); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Fatalf("round trip changed the frame:\n%s\n%s", first.Bytes(), second.Bytes())
	}
}
