// The admin's "Enqueue a task" form: the payload's help shows the rules of the workflow
// chosen, or every workflow's while none is chosen. Without this script all are shown.
"use strict";
(function () {
  function showChosen() {
    const select = document.getElementById("id_workflow");
    if (!select) {
      return;
    }
    for (const item of document.querySelectorAll(".workflow-rules > li[data-workflow]")) {
      item.hidden = select.value !== "" && item.dataset.workflow !== select.value;
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    const select = document.getElementById("id_workflow");
    if (select) {
      select.addEventListener("change", showChosen);
      showChosen();
    }
  });
})();
