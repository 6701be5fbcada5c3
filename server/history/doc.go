// Package history holds the test that every hot path of the control plane
// costs the same DynamoDB requests and read units however long the history
// behind it: terminal invocations, gone workers, expired sessions and
// sockets, finished runs (docs/scale.md, "History-independent paths").
package history
