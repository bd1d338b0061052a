// Live regions (marked data-poll) refresh through htmx polling. While the tab is hidden
// their requests are cancelled; when it shows again they refresh at once.
document.addEventListener("htmx:beforeRequest", (event) => {
  if (document.hidden && event.detail.elt.hasAttribute("data-poll")) {
    event.preventDefault();
  }
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && window.htmx) {
    document.querySelectorAll("[data-poll]").forEach((region) => window.htmx.trigger(region, "refresh"));
  }
});
