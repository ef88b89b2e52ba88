"""Real data for the workbook: text corpora, audio, images, and real requests as a server meets them."""
