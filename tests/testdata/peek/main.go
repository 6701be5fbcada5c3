// Command peek requests a URL and prints the answer's status code: what a
// test runs, as a body or as another user, to try a run's lifecycle view.
//
//	peek URL         GET it
//	peek URL POST    POST to it, with an empty body
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peek URL [POST]")
		os.Exit(2)
	}
	method := http.MethodGet
	if len(os.Args) > 2 && os.Args[2] == "POST" {
		method = http.MethodPost
	}
	req, err := http.NewRequest(method, os.Args[1], nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peek:", err)
		os.Exit(1)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peek:", err)
		os.Exit(1)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
}
