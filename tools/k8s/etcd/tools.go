//go:build tools

// Package tools pins the command this module builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
