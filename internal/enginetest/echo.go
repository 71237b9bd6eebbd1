package enginetest

import (
	"context"
	"errors"
	"io"

	"github.com/kernrpc/kernrpc"
)

// EchoStream is a bidirectional stream handler that answers every message
// with itself until the client closes its side.
func EchoStream[M any](_ context.Context, st kernrpc.ServerStreamOf[M, M]) error {
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := st.Send(m); err != nil {
			return err
		}
	}
}
