set terminal pngcairo size 960,600 noenhanced
set output '/work/main/docs/fidelity/3-approx-error-error-vs-keep.png'
set title 'Error against K'
set xlabel 'keep K'
set ylabel 'kl_mean (nats), max |logit diff|'
set grid
set key outside right
set logscale y 10
set format y '%g'
$kl0 << EOD
70 1.944553651e-07
100 8.251330292e-09
140 2.154067015e-11
200 1.177854592e-14
253 7.862857395e-15
EOD
$max0 << EOD
70 0.04781490564
100 0.01222014427
140 0.0006985664368
200 6.675720215e-06
253 6.675720215e-06
EOD
$kl1 << EOD
70 1.944528789e-07
100 8.331958186e-08
140 8.331958186e-08
200 8.331958186e-08
253 8.331958186e-08
EOD
$max1 << EOD
70 0.04781424999
100 0.0463476181
140 0.0463476181
200 0.0463476181
253 0.0463476181
EOD
$kl2 << EOD
70 1.94453513e-07
100 8.250969227e-09
140 2.156365047e-11
200 5.308582169e-14
253 5.214349015e-14
EOD
$max2 << EOD
70 0.04781460762
100 0.01222038269
140 0.0006984472275
200 7.629394531e-06
253 6.675720215e-06
EOD
$kl3 << EOD
70 1.944530619e-07
100 8.331958186e-08
140 8.331958186e-08
200 8.331958186e-08
253 8.331958186e-08
EOD
$max3 << EOD
70 0.04781454802
100 0.0463476181
140 0.0463476181
200 0.0463476181
253 0.0463476181
EOD
plot $kl0 using 1:2 with linespoints pt 7 lc 1 title 'kl_mean mask H=0', \
     $max0 using 1:2 with linespoints pt 5 dt 2 lc 1 title 'max_abs_logit_diff mask H=0', \
     $kl1 using 1:2 with linespoints pt 7 lc 2 title 'kl_mean mask H=304', \
     $max1 using 1:2 with linespoints pt 5 dt 2 lc 2 title 'max_abs_logit_diff mask H=304', \
     $kl2 using 1:2 with linespoints pt 7 lc 3 title 'kl_mean compact H=0', \
     $max2 using 1:2 with linespoints pt 5 dt 2 lc 3 title 'max_abs_logit_diff compact H=0', \
     $kl3 using 1:2 with linespoints pt 7 lc 4 title 'kl_mean compact H=304', \
     $max3 using 1:2 with linespoints pt 5 dt 2 lc 4 title 'max_abs_logit_diff compact H=304'
set output
