// The console's few behaviours, each an extra: every page works without this file.

// Live regions (marked data-poll) refresh through htmx polling. A refresh is not asked for
// while the tab is hidden or while someone is in the region (focus inside it, or a field
// typed into: a swap would take either away; fields marked hx-preserve survive a swap and
// do not count), and its answer is dropped if that began meanwhile or if someone's own
// request is on its way (that answer is meant for the region as it is). When the tab shows
// again they refresh at once.
function inUse(region) {
  const kept = (element) => element.closest("[hx-preserve]") !== null;
  const edited = [...region.querySelectorAll("input, textarea")].some(
    (field) => !kept(field) && field.value !== field.defaultValue,
  );
  const active = document.activeElement;
  return edited || (active !== region && region.contains(active) && !kept(active));
}

document.addEventListener("htmx:beforeRequest", (event) => {
  const elt = event.detail.elt;
  if (!elt.hasAttribute("data-poll")) {
    // Someone's own request wins over a refresh on its way, which would replace the region
    // this request's answer goes to.
    document.querySelectorAll("[data-poll].htmx-request").forEach((region) => {
      window.htmx.trigger(region, "htmx:abort");
    });
  } else if (document.hidden || inUse(elt)) {
    event.preventDefault();
  }
});

document.addEventListener("htmx:beforeSwap", (event) => {
  // The element that asked (this event's own elt is the target).
  const asker = event.detail.requestConfig && event.detail.requestConfig.elt;
  if (asker && asker.hasAttribute("data-poll")
      && (inUse(asker) || document.querySelector(".htmx-request:not([data-poll])"))) {
    event.detail.shouldSwap = false;
  }
});

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && window.htmx) {
    document.querySelectorAll("[data-poll]").forEach((region) => window.htmx.trigger(region, "refresh"));
  }
  refreshTimes();
});

// Relative times ({% when %}: "3 min ago") stay true while a page stays open: every 30 s
// while the tab is visible. The wording is tasks_app.operations.durations.short_duration's.
function shortDuration(seconds) {
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return minutes % 60 ? `${hours} h ${minutes % 60} min` : `${hours} h`;
  const days = Math.floor(hours / 24);
  return hours % 24 ? `${days} d ${hours % 24} h` : `${days} d`;
}

function relativeTo(moment, now) {
  const delta = now - Date.parse(moment);
  if (Number.isNaN(delta)) return null;
  const seconds = Math.floor(Math.abs(delta) / 1000);
  if (seconds < 1) return "just now";
  return delta > 0 ? `${shortDuration(seconds)} ago` : `in ${shortDuration(seconds)}`;
}

function refreshTimes() {
  if (document.hidden) return;
  const now = Date.now();
  document.querySelectorAll("time[data-when]").forEach((time) => {
    const text = relativeTo(time.dateTime, now);
    if (text === null) return;
    if (time.dataset.when === "full") {
      const part = time.querySelector("span");
      if (part) part.textContent = `(${text})`;
      time.title = text;
    } else {
      time.textContent = text;
    }
  });
}

setInterval(refreshTimes, 30_000);

// "/" (outside a field) goes to the header's "go to task" box.
document.addEventListener("keydown", (event) => {
  if (event.key !== "/" || event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.target.closest && event.target.closest("input, textarea, select, [contenteditable]")) return;
  const box = document.getElementById("goto-id");
  if (box) {
    event.preventDefault();
    box.focus();
    box.select();
  }
});

// On a phone a table shows each row as a card (console.css, .stacks): each cell is
// labelled with its column's heading here, for the tables on the page and those htmx
// swaps in.
function labelTables(root) {
  const tables = root.matches && root.matches("table.grid") ? [root] : [...root.querySelectorAll("table.grid")];
  tables.forEach((table) => {
    const headings = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
    if (!headings.length) return;
    table.querySelectorAll("tbody tr").forEach((row) => {
      let column = 0;
      [...row.cells].forEach((cell) => {
        if (cell.colSpan === 1 && headings[column]) cell.dataset.label = headings[column];
        column += cell.colSpan;
      });
    });
    table.classList.add("stacks");
  });
}

document.addEventListener("DOMContentLoaded", () => labelTables(document));
// Right after a swap, before the browser paints it (htmx:load comes a settle later, which
// would show a refreshed list as a table for a moment); htmx:load for anything else.
document.addEventListener("htmx:afterSwap", (event) => labelTables(event.detail.elt));
document.addEventListener("htmx:load", (event) => labelTables(event.detail.elt));
// A region an action's answer carries out of band (its target is the element swapped in).
document.addEventListener("htmx:oobAfterSwap", (event) => labelTables(event.target));

// The Schedules pages show times in the reader's time zone: the browser names it in the
// ``tz`` cookie, which the server checks against its own zone list
// (console.schedule_zones). A page read by GET that showed another zone (data-time-zone)
// is loaded once more with it; the cookie then matches, so it is never loaded twice.
function rememberTimeZone() {
  let zone = "";
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (error) {
    return;
  }
  if (!/^[A-Za-z0-9_+\-/]{1,64}$/.test(zone)) return;
  const cookie = `tz=${zone}`;
  if (document.cookie.split("; ").includes(cookie)) return;
  const secure = window.location.protocol === "https:" ? "; Secure" : "";
  document.cookie = `${cookie}; path=/; max-age=31536000; SameSite=Lax${secure}`;
  const shown = document.querySelector("[data-time-zone]");
  if (shown && shown.dataset.timeZone !== zone && document.cookie.split("; ").includes(cookie)) {
    window.location.reload();
  }
}

rememberTimeZone();
