// Package throngtest holds black-box integration tests for the throng
// WebSocket server, driven with github.com/gorilla/websocket against the real
// binary ($THRONG_BIN, default ../../target/release/throng). Run: go test ./...
package throngtest
