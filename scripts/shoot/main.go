// Command shoot logs in to a running control plane's web view in headless
// chromium and saves a screenshot of one element of one page: how the
// pictures in docs/ui.md are made (scripts/screenshots.sh takes them all).
//
//	go run ./scripts/shoot -url "$LAKESHORE_URL" -token "$LAKESHORE_TOKEN" -out docs/img/timeline.png
//	go run ./scripts/shoot -page /ui/invocations/inv_… -select main -wait '#stdout' -out docs/img/invocation.png
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
)

// shot is one screenshot: the page (a path under the web view), the
// element that must be visible before it is taken, and the element taken.
type shot struct {
	page, wait, sel, out string
	settle               time.Duration
}

func main() {
	url := flag.String("url", os.Getenv("LAKESHORE_URL"), "the control plane")
	token := flag.String("token", os.Getenv("LAKESHORE_TOKEN"), "the operator token")
	var s shot
	flag.StringVar(&s.out, "out", "timeline.png", "where the PNG goes")
	flag.StringVar(&s.page, "page", "/ui/", "the page, a path under the control plane's URL")
	flag.StringVar(&s.wait, "wait", "#timeline", "an element that must be visible before the shot")
	flag.StringVar(&s.sel, "select", "#timeline", "the element to shoot")
	flag.DurationVar(&s.settle, "settle", 0, "how long to let the page refresh itself before the shot (live output, say)")
	flag.Parse()
	if !strings.HasPrefix(s.page, "/") {
		fmt.Fprintln(os.Stderr, "shoot: -page is a path under the control plane's URL, starting with /")
		os.Exit(2)
	}
	if err := take(*url, *token, s); err != nil {
		fmt.Fprintln(os.Stderr, "shoot:", err)
		os.Exit(1)
	}
}

func take(url, token string, s shot) error {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1100, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()
	ctx, cancel := context.WithTimeout(ctx, time.Minute+s.settle)
	defer cancel()
	url = strings.TrimRight(url, "/")
	if err := chromedp.Do(ctx,
		chromedp.Navigate(url+"/ui/"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("timeline")),
	); err != nil {
		return fmt.Errorf("log in: %w", err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(url+s.page), chromedp.WaitVisible(chromedp.CSS(s.wait))); err != nil {
		return fmt.Errorf("open %s: %w", s.page, err)
	}
	if s.settle > 0 {
		select {
		case <-time.After(s.settle):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(s.sel)))
	if err != nil {
		return fmt.Errorf("screenshot %s of %s: %w", s.sel, s.page, err)
	}
	return os.WriteFile(s.out, png, 0o644)
}
