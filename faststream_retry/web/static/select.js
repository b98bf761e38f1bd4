// The group page's "select all" box.
(function () {
  "use strict";
  var all = document.getElementById("all");
  if (!all) return;
  all.addEventListener("change", function () {
    document.querySelectorAll('#letters input[name="id"]').forEach(function (box) {
      box.checked = all.checked;
    });
  });
})();
