// Package wakesock runs an API Gateway WebSocket API locally: it holds the
// sockets, hands their $connect, $disconnect and messages to a Route (the
// wake channel's handler in process, or the real wake bootstrap under the
// Lambda runtime emulator with `lakeshore dev --lambdas`), and serves the
// management API (POST, GET, DELETE /@connections/{id}) that posts to them.
// It is also a control.Poster, for the in-process dev server. What it does
// not emulate: API Gateway's 10-minute idle and 2-hour connection limits,
// and its SigV4 check of management calls: each must carry the server's
// secret in wire.WakeSecretHeader instead, so that nobody else on the
// machine who learns a socket id can post to it or close it.
package wakesock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/coder/websocket"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Route runs one route of the API: "$connect", "$disconnect" or
// "$default" (a message from the client, in Body). A $connect answered
// other than 2xx refuses the socket with that status; a message's answer
// Body, if any, is sent back on the socket (a route response).
type Route func(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error)

// writeTimeout bounds one post to a socket.
const writeTimeout = 5 * time.Second

// maxPost is API Gateway's largest message (128 KB).
const maxPost = 128 << 10

// Server serves the sockets at Path and the management API under
// Path + "/@connections/". Build it with New.
type Server struct {
	route  Route
	path   string
	secret string
	log    *slog.Logger

	mu    sync.Mutex
	conns map[string]*websocket.Conn
	// pending holds the sockets between $connect and the end of their
	// handshake: a post to one waits for it instead of finding it gone
	// (the client may already hold its end).
	pending map[string]chan struct{}
	// doomed holds pending sockets closed before their handshake ended:
	// they are refused when it does.
	doomed map[string]bool
	closed bool
	wg     sync.WaitGroup // every socket, until its $disconnect ran
}

// New returns a server for the API at path (e.g. "/wake": the stage) whose
// management calls must carry secret ("": the management API refuses
// every call; the server's own Post and CloseConnection still work).
func New(path, secret string, route Route, log *slog.Logger) *Server {
	return &Server{route: route, path: strings.TrimSuffix(path, "/"), secret: secret, log: log, conns: map[string]*websocket.Conn{}, pending: map[string]chan struct{}{}, doomed: map[string]bool{}}
}

// ServeHTTP takes a socket at the API's path, and management calls below it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := strings.CutPrefix(r.URL.Path, s.path+"/@connections/"); ok && id != "" && !strings.Contains(id, "/") {
		s.manage(w, r, id)
		return
	}
	if r.URL.Path != s.path || r.Method != http.MethodGet {
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
		return
	}
	s.serveSocket(w, r)
}

func (s *Server) serveSocket(w http.ResponseWriter, r *http.Request) {
	raw, err := auth.Random(12)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"message": "Internal server error"})
		return
	}
	id := raw + "="
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"message": "Service Unavailable"})
		return
	}
	ready := make(chan struct{})
	s.pending[id] = ready
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	// settle ends the pending state: conn is held from now on, unless it
	// is nil (refused) or the server closed meanwhile (false).
	settle := func(conn *websocket.Conn) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.pending, id)
		defer close(ready)
		doomed := s.doomed[id]
		delete(s.doomed, id)
		if conn == nil || s.closed || doomed {
			return false
		}
		s.conns[id] = conn
		return true
	}

	resp, err := s.route(r.Context(), s.event(r, "$connect", "CONNECT", id, ""))
	if err != nil || resp.StatusCode < 200 || resp.StatusCode > 299 {
		settle(nil)
		status := resp.StatusCode
		if err != nil || status == 0 {
			status = http.StatusInternalServerError
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, resp.Body)
		return
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		settle(nil)
		s.disconnect(r, id) // $connect recorded it
		return
	}
	if !settle(conn) {
		conn.CloseNow()
		s.disconnect(r, id)
		return
	}
	s.readLoop(r, id, conn)
}

// readLoop hands each message to the $default route until the socket
// closes, then runs $disconnect.
func (s *Server) readLoop(r *http.Request, id string, conn *websocket.Conn) {
	ctx := context.WithoutCancel(r.Context())
	defer func() {
		s.mu.Lock()
		delete(s.conns, id)
		s.mu.Unlock()
		conn.CloseNow()
		s.disconnect(r, id)
	}()
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			return
		}
		resp, err := s.route(ctx, s.event(r, "$default", "MESSAGE", id, string(msg)))
		if err != nil {
			s.log.Warn("wake socket message", "connection_id", id, "error", err.Error())
			continue
		}
		if resp.Body != "" {
			wctx, cancel := context.WithTimeout(ctx, writeTimeout)
			err := conn.Write(wctx, websocket.MessageText, []byte(resp.Body))
			cancel()
			if err != nil {
				return
			}
		}
	}
}

func (s *Server) disconnect(r *http.Request, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
	defer cancel()
	if _, err := s.route(ctx, s.event(r, "$disconnect", "DISCONNECT", id, "")); err != nil {
		s.log.Warn("wake socket $disconnect", "connection_id", id, "error", err.Error())
	}
}

// event is the API Gateway event of route for socket id, carrying the
// upgrade request's headers and query.
func (s *Server) event(r *http.Request, route, kind, id, body string) events.APIGatewayWebsocketProxyRequest {
	headers := map[string]string{}
	for k, v := range r.Header {
		headers[k] = strings.Join(v, ",")
	}
	query := map[string]string{}
	for k, v := range r.URL.Query() {
		query[k] = strings.Join(v, ",")
	}
	return events.APIGatewayWebsocketProxyRequest{
		Headers: headers, QueryStringParameters: query, Body: body,
		RequestContext: events.APIGatewayWebsocketProxyRequestContext{
			RouteKey: route, EventType: kind, ConnectionID: id, Stage: strings.TrimPrefix(s.path, "/"),
			DomainName: r.Host, RequestTimeEpoch: time.Now().UnixMilli(),
		},
	}
}

// lookup returns socket id, waiting for it to finish its handshake if it
// is still pending.
func (s *Server) lookup(ctx context.Context, id string) (*websocket.Conn, bool) {
	s.mu.Lock()
	conn, ok := s.conns[id]
	ready, pending := s.pending[id]
	s.mu.Unlock()
	if ok || !pending {
		return conn, ok
	}
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	conn, ok = s.conns[id]
	return conn, ok
}

// Wake tells socket id that work for queue arrived (wire.WakeFor).
func (s *Server) Wake(ctx context.Context, id, queue string) error {
	return s.Post(ctx, id, wire.WakeFor(queue))
}

// Post sends msg to socket id as a text message; a socket this server does
// not hold answers control.ErrConnectionGone.
func (s *Server) Post(ctx context.Context, id string, msg []byte) error {
	conn, ok := s.lookup(ctx, id)
	if !ok {
		return fmt.Errorf("post to %s: %w", id, control.ErrConnectionGone)
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if err := conn.Write(ctx, websocket.MessageText, msg); err != nil {
		conn.CloseNow() // its read loop runs $disconnect
		return fmt.Errorf("post to %s: %w: %w", id, control.ErrConnectionGone, err)
	}
	return nil
}

// CloseConnection closes socket id, as the management API's DELETE does;
// one still in its $connect is refused when that ends. A socket this
// server does not hold answers control.ErrConnectionGone. It does not wait
// for the client's side of the close.
func (s *Server) CloseConnection(_ context.Context, id string) error {
	s.mu.Lock()
	conn, ok := s.conns[id]
	if _, pending := s.pending[id]; pending {
		s.doomed[id] = true
		ok = true
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("close %s: %w", id, control.ErrConnectionGone)
	}
	if conn != nil {
		closeConn(conn)
	}
	return nil
}

// closeConn starts the close handshake of conn; its read loop ends and
// runs $disconnect. A client that never answers the close frame holds
// only that goroutine, for the library's close timeout.
func closeConn(conn *websocket.Conn) {
	go func() { _ = conn.Close(websocket.StatusNormalClosure, "closed by the control plane") }()
}

// manage serves the management API for socket id, answering as API
// Gateway does: 410 GoneException for a socket it does not hold.
func (s *Server) manage(w http.ResponseWriter, r *http.Request, id string) {
	if !auth.Equal(r.Header.Get(wire.WakeSecretHeader), s.secret) {
		// API Gateway's answer to a call its SigV4 check refuses.
		w.Header().Set("X-Amzn-ErrorType", "ForbiddenException")
		writeJSON(w, http.StatusForbidden, map[string]string{"message": "Forbidden"})
		return
	}
	switch r.Method {
	case http.MethodPost:
		msg, err := io.ReadAll(io.LimitReader(r.Body, maxPost+1))
		if err != nil || len(msg) > maxPost {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"message": "Message too long"})
			return
		}
		err = s.Post(r.Context(), id, msg)
		if errors.Is(err, control.ErrConnectionGone) {
			gone(w)
			return
		}
		w.WriteHeader(http.StatusOK)
	case http.MethodDelete:
		// Without waiting for a socket still in its $connect: that
		// $connect may itself be closing the caller's socket (two sockets
		// of one worker replacing each other), and neither would end.
		if err := s.CloseConnection(r.Context(), id); err != nil {
			gone(w)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case http.MethodGet:
		if _, ok := s.lookup(r.Context(), id); !ok {
			gone(w)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"identity": map[string]string{}})
	default:
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"message": "Method Not Allowed"})
	}
}

// gone answers as API Gateway does for a socket that no longer exists; the
// SDK reads the error type from the header.
func gone(w http.ResponseWriter) {
	w.Header().Set("X-Amzn-ErrorType", "GoneException")
	writeJSON(w, http.StatusGone, map[string]string{"message": "Gone"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Close closes every socket and waits for their $disconnect routes.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*websocket.Conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close(websocket.StatusGoingAway, "the control plane is shutting down")
	}
	s.wg.Wait()
}

// Connections reports how many sockets the server holds.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}
