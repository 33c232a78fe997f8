// Refresh the page body every 15 s from the server-rendered partial; keep the page when a refresh fails.
(function () {
  const main = document.getElementById("gpupool");
  async function refresh() {
    try {
      const url = new URL(window.location.href);
      url.searchParams.set("partial", "1");
      const response = await fetch(url, { credentials: "same-origin" });
      if (response.ok) { main.innerHTML = await response.text(); main.dataset.refreshed = Date.now(); }
    } catch (e) { console.warn("gpupool refresh failed", e); }
  }
  setInterval(refresh, 15000);
})();

// Links to Airflow's own pages (task instances). Airflow shows this page in an iframe sandboxed
// without top navigation, so `target="_top"` is blocked ("Unsafe attempt to initiate navigation").
// The frame is same-origin, though: push the URL onto the Airflow UI's history and tell its router
// (a popstate, as the Back button sends), which navigates without reloading. Opened on its own,
// or if the parent cannot be reached, the link navigates as a plain link.
(function () {
  function airflowNavigate(href) {
    const top = window.top;
    if (top === window) return false;
    try {
      const target = new URL(href, top.location.href);
      if (target.origin !== top.location.origin) return false;
      top.history.pushState(top.history.state, "", target.pathname + target.search + target.hash);
      top.dispatchEvent(new PopStateEvent("popstate", { state: top.history.state }));
      return true;
    } catch (e) {
      console.warn("gpupool: cannot reach the Airflow UI, following the link in place", e);
      return false;
    }
  }
  document.addEventListener("click", function (event) {
    const link = event.target.closest && event.target.closest("a[data-airflow-link]");
    if (!link || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    if (airflowNavigate(link.getAttribute("href"))) event.preventDefault();
  });
})();

// Count a preempting grant's grace down each second from the seconds left the server rendered
// (`data-left`, right at render time without this script): the browser's clock need not agree
// with the ledger's, so the script counts from when the element appeared. A refresh brings new
// elements, which count from their own render.
(function () {
  function duration(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  }
  function tick() {
    const now = performance.now();
    document.querySelectorAll(".countdown[data-left]").forEach(function (el) {
      if (!el.dataset.shownAt) el.dataset.shownAt = String(now);
      const left = parseFloat(el.dataset.left) - (now - parseFloat(el.dataset.shownAt)) / 1000;
      el.textContent = duration(Math.ceil(left)); // whole seconds round up, as the server's do
      el.classList.toggle("due", left <= 0);
    });
  }
  tick();
  setInterval(tick, 1000);
})();
