set terminal pngcairo size 960,600 noenhanced
set output 'docs/experiments/4-approx-error-error-vs-keep.png'
set title 'Error against K'
set xlabel 'keep K'
set ylabel 'kl_mean (nats), max |logit diff|'
set grid
set key outside right
set logscale y 10
set format y '%g'
$kl0 << EOD
134 5.205059477e-06
268 1.048601158e-09
536 4.344437831e-13
1017 1.294566211e-13
EOD
$max0 << EOD
134 0.01758265495
268 0.0002262592316
536 4.529953003e-06
1017 2.384185791e-06
EOD
$kl1 << EOD
134 5.205059477e-06
268 4.604459354e-07
536 4.604459354e-07
1017 4.604459354e-07
EOD
$max1 << EOD
134 0.01758265495
268 0.005166053772
536 0.005166053772
1017 0.005166053772
EOD
$kl2 << EOD
134 5.204855815e-06
268 1.046159569e-09
536 8.256190679e-13
1017 8.823314955e-13
EOD
$max2 << EOD
134 0.01758205891
268 0.0002249479294
536 6.318092346e-06
1017 5.960464478e-06
EOD
$kl3 << EOD
134 5.204855815e-06
268 4.604459354e-07
536 4.604459354e-07
1017 4.604459354e-07
EOD
$max3 << EOD
134 0.01758205891
268 0.005166053772
536 0.005166053772
1017 0.005166053772
EOD
plot $kl0 using 1:2 with linespoints pt 7 lc 1 title 'kl_mean mask H=0', \
     $max0 using 1:2 with linespoints pt 5 dt 2 lc 1 title 'max_abs_logit_diff mask H=0', \
     $kl1 using 1:2 with linespoints pt 7 lc 2 title 'kl_mean mask H=1344', \
     $max1 using 1:2 with linespoints pt 5 dt 2 lc 2 title 'max_abs_logit_diff mask H=1344', \
     $kl2 using 1:2 with linespoints pt 7 lc 3 title 'kl_mean compact H=0', \
     $max2 using 1:2 with linespoints pt 5 dt 2 lc 3 title 'max_abs_logit_diff compact H=0', \
     $kl3 using 1:2 with linespoints pt 7 lc 4 title 'kl_mean compact H=1344', \
     $max3 using 1:2 with linespoints pt 5 dt 2 lc 4 title 'max_abs_logit_diff compact H=1344'
set output
