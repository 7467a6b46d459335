// "Open in Perfetto" beside each trace the book serves (links of class perfetto-open, the trace
// in data-trace). ui.perfetto.dev opens a trace that the page which opened its window posts to
// it (https://perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui): post 'PING' until
// it answers 'PONG', then post {perfetto: {buffer, title, fileName}}. It reads the gzipped JSON
// traces as they are; the trace goes from this page to that window, no server is involved.
(function () {
  "use strict";
  const ORIGIN = "https://ui.perfetto.dev";

  async function openTrace(link) {
    const ui = window.open(ORIGIN + "/#!/"); // on the click itself, or it is a blocked pop-up
    if (!ui) throw new Error("the browser blocked the Perfetto window");
    const url = new URL(link.dataset.trace, document.baseURI);
    const response = await fetch(url);
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    const buffer = await response.arrayBuffer();
    const fileName = url.pathname.split("/").pop();
    const title = link.dataset.title || fileName;
    let tries = 0;
    const ping = setInterval(() => {
      if (++tries > 600 || ui.closed) return done(); // a minute without an answer
      ui.postMessage("PING", ORIGIN);
    }, 100);
    function done() {
      clearInterval(ping);
      window.removeEventListener("message", onMessage);
    }
    function onMessage(event) {
      if (event.source !== ui || event.data !== "PONG") return;
      done();
      ui.postMessage({ perfetto: { buffer: buffer, title: title, fileName: fileName } }, ORIGIN);
    }
    window.addEventListener("message", onMessage);
  }

  document.addEventListener("click", (event) => {
    const link = event.target.closest && event.target.closest("a.perfetto-open[data-trace]");
    if (!link) return;
    event.preventDefault();
    openTrace(link).catch((error) => console.warn("Open in Perfetto:", error.message));
  });
})();
