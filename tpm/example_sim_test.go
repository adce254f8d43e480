//go:build tpmsim

package tpm_test

import (
	"bytes"
	"context"
	"fmt"

	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmsim"
)

// A node key is made once, its record stored as node.key, and derived from
// the record again at every start.
func ExampleTPM_NewNodeKey() {
	ctx := context.Background()
	t, err := tpmsim.Open() // tpm.Open("auto") on a host
	if err != nil {
		panic(err)
	}
	defer t.Close()

	key, rec, err := t.NewNodeKey(ctx)
	if err != nil {
		panic(err)
	}
	nodeKeyFile, err := tpm.MarshalKeyRecord(rec)
	if err != nil {
		panic(err)
	}
	key.Close()

	rec, err = tpm.ParseKeyRecord(nodeKeyFile)
	if err != nil {
		panic(err)
	}
	again, err := t.LoadNodeKey(ctx, rec)
	if err != nil {
		panic(err)
	}
	defer again.Close()
	fmt.Println(bytes.HasPrefix(nodeKeyFile, []byte("-----BEGIN NODETRUST TPM KEY-----")))
	fmt.Println(bytes.Equal(again.Name(), key.Name()))
	// Output:
	// true
	// true
}
