// Command callsigclient is an instance for the integration tests of signed
// calls: started by bcd run, it signs with nothing but package localapi.
//
//	callsigclient hold                     print its start and key, call status, wait for "exit" on stdin
//	callsigclient call [-node N] [-address A] SERVICE METHOD [JSON]   make a call, print "ok <reply>" or "error <message>"
//	callsigclient as SENDER SERVICE METHOD [JSON]        the same, signed with its key under another sender id
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/nodetrust/nodetrust/callsig"
	"github.com/nodetrust/nodetrust/localapi"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: callsigclient hold|call|as …")
		os.Exit(2)
	}
	ctx := context.Background()
	switch os.Args[1] {
	case "hold":
		hold(ctx)
	case "call":
		fs := flag.NewFlagSet("call", flag.ExitOnError)
		node := fs.String("node", "", "receiver node")
		address := fs.String("address", "", "federation address of the receiver node")
		_ = fs.Parse(os.Args[2:])
		c, err := localapi.FromEnv(ctx)
		if err != nil {
			fail(err)
		}
		call(ctx, c, *node, *address, fs.Args())
	case "as":
		rt, err := localapi.RuntimeFromEnv()
		if err != nil {
			fail(err)
		}
		rt.Sender = os.Args[2]
		key, err := localapi.ReadKeyFile(rt.KeyFile)
		if err != nil {
			fail(err)
		}
		signer, err := callsig.NewSigner(callsig.SignerConfig{Sender: os.Args[2], Key: key})
		if err != nil {
			fail(err)
		}
		c, err := localapi.Dial(ctx, rt.Socket, signer)
		if err != nil {
			fail(err)
		}
		call(ctx, c, "", "", os.Args[3:])
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func hold(ctx context.Context) {
	rt, err := localapi.RuntimeFromEnv()
	if err != nil {
		fail(err)
	}
	key, err := localapi.ReadKeyFile(rt.KeyFile)
	if err != nil {
		fail(err)
	}
	fmt.Printf("runtime %s\n", os.Getenv(localapi.EnvRuntime))
	fmt.Printf("keyfile %s\n", rt.KeyFile)
	fmt.Printf("sender %s\n", rt.Sender)
	fmt.Printf("seed %s\n", hex.EncodeToString(key.Seed()))
	c, err := localapi.FromEnv(ctx)
	if err != nil {
		fail(err)
	}
	var st localapi.Status
	if err := c.Call(ctx, localapi.ServiceStatus, localapi.MethodGet, nil, &st); err != nil {
		fail(err)
	}
	fmt.Printf("caller %s\n", st.Caller)
	fmt.Println("holding")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "exit" {
			break
		}
	}
}

func call(ctx context.Context, c *localapi.Client, node, address string, args []string) {
	if len(args) < 2 {
		fail(fmt.Errorf("call: want SERVICE METHOD [JSON]"))
	}
	var req any
	if len(args) > 2 {
		req = json.RawMessage(args[2])
	}
	var reply json.RawMessage
	if err := c.Do(ctx, localapi.Call{Node: node, Address: address, Service: args[0], Method: args[1], Request: req}, &reply); err != nil {
		fmt.Printf("error %v\n", err)
		return
	}
	fmt.Printf("ok %s\n", reply)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "callsigclient:", err)
	os.Exit(1)
}
