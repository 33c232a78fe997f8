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
