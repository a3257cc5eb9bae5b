"""Widgets of `gpuadvise view`. The big ones (TableView, TimelineView) use Textual's Line API: they
draw only the lines on screen, so their cost does not grow with the number of rows or events."""
