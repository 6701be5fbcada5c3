// Command shoot logs in to a running control plane's web view in headless
// chromium and saves a screenshot of its timeline: how the README's
// picture of `make demo`'s kill is made.
//
//	go run ./scripts/shoot -url "$LAKESHORE_URL" -token "$LAKESHORE_TOKEN" -out docs/img/timeline.png
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/chromedp/chromedp"
)

func main() {
	url := flag.String("url", os.Getenv("LAKESHORE_URL"), "the control plane")
	token := flag.String("token", os.Getenv("LAKESHORE_TOKEN"), "the operator token")
	out := flag.String("out", "timeline.png", "where the PNG goes")
	sel := flag.String("select", "#timeline", "the element to shoot")
	flag.Parse()
	if err := shoot(*url, *token, *sel, *out); err != nil {
		fmt.Fprintln(os.Stderr, "shoot:", err)
		os.Exit(1)
	}
}

func shoot(url, token, sel, out string) error {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1100, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(url+"/ui/"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("timeline")),
	); err != nil {
		return fmt.Errorf("log in: %w", err)
	}
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(sel)))
	if err != nil {
		return fmt.Errorf("screenshot %s: %w", sel, err)
	}
	return os.WriteFile(out, png, 0o644)
}
