// Refresh the page body every 15 s from the server-rendered partial; keep the page when a refresh fails.
(function () {
  const main = document.getElementById("gpupool");
  async function refresh() {
    // Never under a person's hands: a half-typed priority or a page of actions stays as it is.
    if (document.activeElement && document.activeElement.closest && document.activeElement.closest("form.act")) return;
    if (document.querySelector("section.refused, section.confirm")) return;
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

// The Airflow UI's menu entry ("Browse → GPU pool") always opens the overview. Airflow keeps this
// frame when the entry is clicked while its route is shown, so a frame left on a reservation or a
// team page would stay there: the frame (same-origin) listens for that click in the Airflow UI and
// goes back to the overview. One listener per frame: a newer page of the frame replaces it.
(function () {
  const top = window.top;
  const at = window.location.pathname.indexOf("/gpupool/");
  if (top === window || at < 0) return;
  const overview = window.location.pathname.slice(0, at) + "/gpupool/";
  try {
    if (top.__gpupoolMenuClick) top.document.removeEventListener("click", top.__gpupoolMenuClick, true);
    const frame = window.frameElement;
    top.__gpupoolMenuClick = function (event) {
      const link = event.target.closest && event.target.closest("a[href]");
      if (!link || !frame || !frame.isConnected) return;
      const path = new URL(link.getAttribute("href"), top.location.href).pathname.replace(/\/$/, "");
      if (path.endsWith("/plugin/gpupool") && window.location.pathname !== overview) window.location.assign(overview);
    };
    top.document.addEventListener("click", top.__gpupoolMenuClick, true);
  } catch (e) {
    console.warn("gpupool: cannot reach the Airflow UI's menu", e);
  }
})();
